//! Same-node ranks hosted by *other processes* (one rank per process): their buffers are mapped
//! into this process through IPC handles (`Buffer::ipc_handle` / `Device::open_ipc`: on the
//! emulator a shared segment mapped at the exporter's own address, on GPUs CUDA IPC), so the
//! kernels store into a node peer's ring or home buffer directly, as NVLink kernels do. The
//! handles travel in the rows of [`Transport::all_gather`], after the caller's own words.
//!
//! Row layout: `[n_extra, extra.., text_len, text bytes packed 4 per word (little-endian)..]`;
//! `text_len` 0 means the buffer could not be exported (an error only if a peer needs it).

use crate::transport::{LinkClass, Transport};
use crate::{EpError, Result};
use runtime::{Buffer, Device, IpcHandle};

/// What one rank published: its extra words and its buffer's handle.
pub(crate) struct PeerRow {
    pub extra: Vec<u32>,
    pub handle: Option<IpcHandle>,
}

fn encode(extra: &[u32], buf: &Buffer<u8>, spans: bool) -> Vec<u32> {
    let mut row = vec![extra.len() as u32];
    row.extend_from_slice(extra);
    // only a group that spans processes may need the handle
    let text = match spans {
        true => buf.ipc_handle().map(|h| h.to_text()).unwrap_or_default(),
        false => String::new(),
    };
    row.push(text.len() as u32);
    for c in text.as_bytes().chunks(4) {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        row.push(u32::from_le_bytes(w));
    }
    row
}

fn decode(rank: usize, row: &[u32]) -> Result<PeerRow> {
    let bad = || EpError::Engine(format!("malformed peer row of rank {rank}"));
    let n = *row.first().ok_or_else(bad)? as usize;
    let extra = row.get(1..1 + n).ok_or_else(bad)?.to_vec();
    let len = *row.get(1 + n).ok_or_else(bad)? as usize;
    let words = row.get(2 + n..2 + n + len.div_ceil(4)).ok_or_else(bad)?;
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(len);
    let handle = match len {
        0 => None,
        _ => {
            let text = String::from_utf8(bytes).map_err(|_| bad())?;
            Some(IpcHandle::from_text(&text)?)
        }
    };
    Ok(PeerRow { extra, handle })
}

/// All-gathers every rank's `extra[i]` words and, when the group spans processes, the IPC
/// handle of `bufs[i]` (both indexed like `hosted`); returns one row per rank of the job.
pub(crate) fn gather(
    tr: &dyn Transport,
    hosted: &[u32],
    bufs: &[Buffer<u8>],
    extra: &[Vec<u32>],
) -> Result<Vec<PeerRow>> {
    let spans = hosted.len() < tr.ranks() as usize;
    let mine = bufs
        .iter()
        .zip(extra)
        .map(|(b, e)| encode(e, b, spans))
        .collect();
    tr.all_gather(hosted, mine)?
        .iter()
        .enumerate()
        .map(|(r, row)| decode(r, row))
        .collect()
}

/// Maps, for every rank that shares a node with a hosted rank but is hosted elsewhere, its
/// published buffer on the device of a hosted rank of that node (index = rank; `None` for the
/// others). The mappings stay valid while the returned buffers live.
pub(crate) fn map_node_peers(
    tr: &dyn Transport,
    hosted: &[u32],
    devices: &[Device],
    rows: &[PeerRow],
) -> Result<Vec<Option<Buffer<u8>>>> {
    let mut out = Vec::with_capacity(rows.len());
    for (dst, row) in rows.iter().enumerate() {
        let dst = dst as u32;
        let mate = hosted
            .iter()
            .position(|&r| tr.link(r, dst) == LinkClass::IntraNode);
        let mapped = match (hosted.contains(&dst), mate) {
            (false, Some(i)) => {
                let h = row.handle.as_ref().ok_or_else(|| {
                    EpError::Config(format!(
                        "rank {dst} shares a node with hosted rank {} but published no IPC handle",
                        hosted[i]
                    ))
                })?;
                Some(devices[i].open_ipc::<u8>(h)?)
            }
            _ => None,
        };
        out.push(mapped);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_extra_words_and_handles() {
        let d = Device::emu(0);
        let b = d.alloc::<u8>(300).unwrap();
        for spans in [false, true] {
            let row = encode(&[7, 9], &b, spans);
            let p = decode(3, &row).unwrap();
            assert_eq!(p.extra, vec![7, 9]);
            assert_eq!(p.handle, spans.then(|| b.ipc_handle().unwrap()));
        }
        assert!(decode(1, &[5, 1]).is_err(), "truncated row");
    }
}
