//! `mpirun -np 2 netmpi-proxy-check`: the proxy transport between two processes over the MPI
//! engine, the host playing the kernels' part. Each process produces records into its send
//! window for the other (ring of 4 slots, tail published every 2 records, the last with the
//! finished bit, waiting on the head for space: flow control crosses the processes) and
//! consumes the other's records from its real ring, checking every byte; then a sparse window
//! (single-word puts shipped at the end of the operation) is checked word by word. Prints one
//! `OK` line per rank and exits 0, or names what went wrong and exits 1.

use ep::proxy::{RingSpec, WindowKind, WindowSpec, WIN_DW, WIN_WS};
use ep::{ProxyTransport, Transport};
use netmpi::Mpi;
use runtime::{Device, HostView};
use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const FIN: u32 = 0x8000_0000;
const SLOTS: u32 = 4;
const SLOT_BYTES: u32 = 64;
const DATA: u64 = 64;
const RECORDS: u32 = 50;

fn record(src: u32, i: u32) -> Vec<u8> {
    (0..SLOT_BYTES)
        .map(|b| (src * 131 + i * 7 + b * 3) as u8)
        .collect()
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netmpi-proxy-check: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Produces `RECORDS` records into `shadow` and consumes the peer's from `real`.
fn exchange(p: u32, peer: u32, shadow: &HostView, real: &HostView) -> Result<(), Box<dyn Error>> {
    let (mut sent, mut got) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent < RECORDS || got < RECORDS {
        let mut progress = false;
        if sent < RECORDS && sent - shadow.load_acquire_u32(4)? < SLOTS {
            shadow.write(
                DATA + (sent % SLOTS) as u64 * SLOT_BYTES as u64,
                &record(p, sent),
            )?;
            sent += 1;
            if sent % 2 == 0 || sent == RECORDS {
                let fin = if sent == RECORDS { FIN } else { 0 };
                shadow.store_release_u32(0, sent | fin)?;
            }
            progress = true;
        }
        let tail = real.load_acquire_u32(0)? & !FIN;
        while got < tail {
            let mut b = vec![0u8; SLOT_BYTES as usize];
            real.read(DATA + (got % SLOTS) as u64 * SLOT_BYTES as u64, &mut b)?;
            if b != record(peer, got) {
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

fn run() -> Result<(), Box<dyn Error>> {
    let mpi = Mpi::init()?;
    let (p, n) = (mpi.rank(), mpi.size());
    if n != 2 {
        return Err(format!("run with 2 processes, not {n}").into());
    }
    let peer = 1 - p;
    let dev = Device::emu(p);
    let mut devices = vec![None, None];
    devices[p as usize] = Some(dev.clone());
    let engines: Vec<Box<dyn ep::Engine>> = vec![Box::new(mpi.engine()?)];
    let tr = ProxyTransport::new(devices, 1, engines, Duration::from_secs(20))?;
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
    exchange(p, peer, &shadow, &real.host_view()?)?;
    tr.end()?;

    let sparse = WindowSpec {
        key: WIN_DW,
        kind: WindowKind::Sparse { poison: 0xff },
    };
    let dw = dev.alloc::<u8>(64)?;
    dw.fill(0xff)?;
    tr.expose_window(p, peer, &dw, &sparse)?;
    tr.attach_window(p, peer, 64, &sparse)?;
    let sw = tr.send_window(p, peer, WIN_DW)?;
    tr.begin()?;
    for i in (1..16u32).step_by(2) {
        sw.write(i as u64 * 4, &(p * 1000 + i).to_le_bytes())?;
    }
    tr.end()?;
    let words: Vec<u32> = dw
        .to_bytes()?
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    for (i, &w) in words.iter().enumerate() {
        let want = if i % 2 == 1 {
            peer * 1000 + i as u32
        } else {
            u32::MAX
        };
        if w != want {
            return Err(format!("rank {p}: dw word {i} is {w:#x}, expected {want:#x}").into());
        }
    }
    let stats = tr.stats()?;
    println!("rank {p}: OK {RECORDS} records each way, sparse words landed; proxy {stats:?}");
    drop(tr);
    mpi.barrier();
    Ok(())
}
