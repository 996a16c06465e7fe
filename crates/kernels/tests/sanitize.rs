//! Every library kernel runs its registered test shapes clean under all four emulator
//! sanitizers (`emu::sanitize`: memcheck, racecheck, initcheck, synccheck) and still matches
//! its CPU reference: zero reports on the library.

#[test]
fn every_library_kernel_is_sanitizer_clean() {
    // before any allocation: global initcheck needs the allocations' written-bitmaps
    emu::sanitize::set_process_default(emu::Tools::ALL);
    let dev = runtime::Device::emu(72);
    let st = dev.stream(0);
    let mut checked = 0;
    for info in kernels::registry() {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let rep = info
                .check(&st, s, 700 + i as u64)
                .unwrap_or_else(|e| panic!("{} {s:?}: {e}", info.name));
            assert!(rep.pass, "{} {s:?}: {rep:?}", info.name);
            let stats = st.last_stats().expect("emulator launch statistics");
            assert_eq!(
                stats.sanitized,
                Some(emu::Tools::ALL),
                "{}: launch was not sanitized",
                info.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 100, "only {checked} kernel checks");
}
