//! The two-endpoint proxy check shared by the engines' check programs (`netmpi-proxy-check`,
//! `netnccl-check proxy`): the proxy transport between two processes over an [`Engine`], the
//! host playing the kernels' part. Each endpoint produces records into its send window for the
//! other (a ring of 4 slots, the tail published every 2 records, the last with the finished
//! bit, waiting on the head for space: flow control crosses the processes) and consumes the
//! other's records from its real ring, checking every byte against the record the peer must
//! have made; then a sparse window (single-word puts shipped at the end of the operation) is
//! checked word by word.

use crate::proxy::{ProxyStats, RingSpec, WindowKind, WindowSpec, WIN_DW, WIN_WS};
use crate::selfcheck::Res;
use crate::{Engine, ProxyTransport, Transport};
use runtime::{Device, HostView};
use std::time::{Duration, Instant};

const FIN: u32 = 0x8000_0000;
const SLOTS: u32 = 4;
const SLOT_BYTES: u32 = 64;
const DATA: u64 = 64;

/// Sizes of the check.
#[derive(Clone, Debug)]
pub struct PairCfg {
    /// Records each way.
    pub records: u32,
    /// Mixed into the records' bytes (the same on both endpoints).
    pub seed: u64,
    /// The proxies' timeout, and how long the exchange may take.
    pub timeout: Duration,
}

/// Record `i` of endpoint `src`.
fn record(src: u32, i: u32, seed: u64) -> Vec<u8> {
    (0..SLOT_BYTES)
        .map(|b| (src as u64 * 131 + i as u64 * 7 + b as u64 * 3 + seed) as u8)
        .collect()
}

/// Runs the check on this endpoint (`engine` of 2 endpoints; the windows live on emulated
/// device `endpoint`); returns what the proxy moved.
pub fn run(engine: Box<dyn Engine>, c: &PairCfg) -> Res<Vec<(u32, ProxyStats)>> {
    let (p, n) = (engine.endpoint(), engine.endpoints());
    if n != 2 {
        return Err(format!("the proxy check runs on 2 endpoints, not {n}").into());
    }
    let peer = 1 - p;
    let dev = Device::emu(p);
    let mut devices = vec![None, None];
    devices[p as usize] = Some(dev.clone());
    let tr = ProxyTransport::new(devices, 1, vec![engine], c.timeout)?;
    let ring = RingSpec {
        tail_off: 0,
        head_off: 4,
        data_off: DATA,
        slots: SLOTS,
        slot_bytes: SLOT_BYTES,
    };
    let spec = WindowSpec {
        key: WIN_WS,
        kind: WindowKind::Rings(vec![ring]),
    };
    let real = dev.alloc::<u8>((DATA + (SLOTS * SLOT_BYTES) as u64) as usize)?;
    real.fill(0)?;
    tr.expose_window(p, peer, &real, &spec)?;
    tr.attach_window(p, peer, real.len(), &spec)?;
    let shadow = tr.send_window(p, peer, WIN_WS)?;
    tr.begin()?;
    exchange((p, peer), c, &shadow, &real.host_view()?)?;
    tr.end()?;
    sparse(&tr, &dev, p, peer)?;
    Ok(tr.stats()?)
}

/// Produces the records into `shadow`, consumes the peer's from `real` (checking each).
fn exchange((p, peer): (u32, u32), c: &PairCfg, shadow: &HostView, real: &HostView) -> Res<()> {
    let (mut sent, mut got) = (0u32, 0u32);
    let deadline = Instant::now() + c.timeout;
    while sent < c.records || got < c.records {
        let mut progress = false;
        if sent < c.records && sent - shadow.load_acquire_u32(4)? < SLOTS {
            let at = DATA + (sent % SLOTS) as u64 * SLOT_BYTES as u64;
            shadow.write(at, &record(p, sent, c.seed))?;
            sent += 1;
            if sent % 2 == 0 || sent == c.records {
                let fin = if sent == c.records { FIN } else { 0 };
                shadow.store_release_u32(0, sent | fin)?;
            }
            progress = true;
        }
        let tail = real.load_acquire_u32(0)? & !FIN;
        while got < tail {
            let mut b = vec![0u8; SLOT_BYTES as usize];
            real.read(DATA + (got % SLOTS) as u64 * SLOT_BYTES as u64, &mut b)?;
            if b != record(peer, got, c.seed) {
                return Err(format!("rank {p}: record {got} from rank {peer} differs").into());
            }
            got += 1;
            real.store_release_u32(4, got)?;
            progress = true;
        }
        if Instant::now() > deadline {
            return Err(format!("rank {p}: stuck at {sent} sent, {got} received").into());
        }
        if !progress {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    Ok(())
}

/// Odd words of a sparse window put, even ones left at the poison pattern.
fn sparse(tr: &ProxyTransport, dev: &Device, p: u32, peer: u32) -> Res<()> {
    let spec = WindowSpec {
        key: WIN_DW,
        kind: WindowKind::Sparse { poison: 0xff },
    };
    let dw = dev.alloc::<u8>(64)?;
    dw.fill(0xff)?;
    tr.expose_window(p, peer, &dw, &spec)?;
    tr.attach_window(p, peer, 64, &spec)?;
    let sw = tr.send_window(p, peer, WIN_DW)?;
    tr.begin()?;
    for i in (1..16u32).step_by(2) {
        sw.write(i as u64 * 4, &(p * 1000 + i).to_le_bytes())?;
    }
    tr.end()?;
    let b = dw.to_bytes()?;
    for (i, c) in b.chunks(4).enumerate() {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let want = if i % 2 == 1 {
            peer * 1000 + i as u32
        } else {
            u32::MAX
        };
        if w != want {
            return Err(format!("rank {p}: dw word {i} is {w:#x}, expected {want:#x}").into());
        }
    }
    Ok(())
}
