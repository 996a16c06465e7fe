//! `cargo bench -p emu [-- --json] [-- --quick]`: emulator throughput (see `emu::bench`).

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let mut o = emu::bench::BenchOptions::default();
    if args.iter().any(|a| a == "--quick") {
        o.alu_iters = 16;
        o.gemm_size = 128;
    }
    match emu::bench::run(&o) {
        Ok(r) if json => println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default()),
        Ok(r) => println!("{r}"),
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(1);
        }
    }
}
