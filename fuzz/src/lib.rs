//! The fuzz targets' entry functions. Each takes the fuzzer's bytes and panics only when an
//! oracle is violated (or the code under test panics). The same files are compiled into the
//! stable smoke tests (`crates/ptx/tests/fuzz_smoke.rs`, `crates/runtime/tests/fuzz_smoke.rs`)
//! with `#[path]`, so CI runs them over the seed corpora and the regression inputs.
//!
//! The fuzz binaries also refuse any single allocation above [`ALLOC_CAP`]: inputs are a few
//! KiB, so a bigger request means a size taken from the input without a bound (on a machine
//! that overcommits memory it would otherwise succeed lazily and go unnoticed). The refusal
//! aborts the process, which libFuzzer records as a crash.

use std::alloc::{GlobalAlloc, Layout, System};

pub mod ptx_text;
pub mod run_args;

/// The largest single allocation the code under test may make while fuzzing.
pub const ALLOC_CAP: usize = 64 << 20;

struct Capped;

// SAFETY: forwards to the system allocator unchanged; a refused request returns null, which
// `GlobalAlloc` allows (the caller then reports the failure and aborts).
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`; the new size is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static CAPPED: Capped = Capped;
