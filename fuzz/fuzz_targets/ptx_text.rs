#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ptxforge_fuzz::ptx_text::check(data));
