//! `LaunchConfig::cancel`: a flag set from another thread stops a running emulator launch,
//! which then fails with `FaultKind::Interrupted` naming where a warp was (what the Python
//! package's Ctrl-C uses).

use runtime::{Device, LaunchConfig, Module, RuntimeError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SPIN: &str = r"
.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u32 n)
{
  .reg .pred %p<2>; .reg .b32 %r<3>;
  ld.param.u32 %r2, [n];
  mov.u32 %r1, 0;
LOOP:
  add.u32 %r1, %r1, 1;
  setp.ne.u32 %p1, %r1, %r2;
  @%p1 bra LOOP;
  ret;
}
";

#[test]
fn a_cancelled_launch_stops_and_reports_interrupted() {
    let dev = Device::emu(0);
    let m = Module::load_ptx(&dev, SPIN).unwrap();
    let f = m.function("spin").unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let mut cfg = LaunchConfig::linear(4, 64).timeout(Duration::from_secs(120));
    cfg.cancel = Some(cancel.clone());
    let s = dev.new_stream();
    let t = Instant::now();
    // n = 0: the counter wraps around after 2^32 steps, far beyond the test's time
    s.launch(&f, &cfg, &runtime::args![0u32]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    cancel.store(true, Ordering::Relaxed);
    let e = s.synchronize().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    match &e {
        RuntimeError::Emu(emu::EmuError::Fault { kind, site }) => {
            assert_eq!(*kind, emu::FaultKind::Interrupted);
            assert_eq!(site.kernel, "spin");
            assert!((11..=13).contains(&site.line), "{site}");
        }
        other => panic!("expected an interrupted fault, got {other}"),
    }
    // the stream works afterwards: a short run of the same kernel finishes
    cfg.cancel = None;
    s.launch(&f, &cfg, &runtime::args![1000u32]).unwrap();
    s.synchronize().unwrap();
}
