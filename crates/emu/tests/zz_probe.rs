use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
#[test]
fn probe() {
    let dir = std::env::var("PROBE_DIR").unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let text = std::fs::read_to_string(&p).unwrap();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        let kname = name.split("__").nth(1).unwrap().to_string();
        let m = match ptx::parse(&text) {
            Ok(m) => m,
            Err(e) => { println!("GAP parse {name}: {e}"); continue; }
        };
        let errs: Vec<_> = ptx::validate(&m).into_iter().filter(|d| d.is_error()).collect();
        if !errs.is_empty() { println!("GAP validate {name}: {}", errs.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" | ")); }
        match ptx::parse(&ptx::print(&m)) {
            Ok(m2) if m2 == m => {}
            Ok(_) => println!("GAP roundtrip {name}: differs"),
            Err(e) => println!("GAP roundtrip {name}: {e}"),
        }
        let mem = GlobalMemory::new();
        let buf = mem.alloc(4096, 0).unwrap();
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 37 + 11) as u8 | 1).collect();
        buf.write_bytes(0, &bytes);
        let lm = match LoadedModule::load(&mem, m, 0) { Ok(l) => l, Err(e) => { println!("GAP load {name}: {e}"); continue; } };
        let k = match lm.kernel(&kname) { Ok(k) => k, Err(e) => { println!("GAP decode {name}: {e}"); continue; } };
        let mut params = buf.base.to_le_bytes().to_vec();
        params.extend_from_slice(&7u32.to_le_bytes());
        params.extend_from_slice(&[0u8; 4]);
        params.extend((0..32u8).map(|i| i + 1));
        let cl = if text.contains(".reqnctapercluster 2") { 2 } else { 1 };
        let cfg = LaunchConfig { cluster: [cl, 1, 1], ..LaunchConfig::linear(cl, 32) };
        match launch(k, mem.snapshot(), params, &cfg, &LaunchOptions::default()) {
            Ok(_) => println!("OK {name}"),
            Err(e) => println!("GAP run {name}: {e}"),
        }
    }
}
