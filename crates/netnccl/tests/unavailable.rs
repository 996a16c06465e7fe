//! Without a libnccl, every entry point of the crate is `NcclUnavailable` (never a panic).
//! (Its own test binary: the library is looked up once per process.)

use netnccl::{Comm, NcclError, UniqueId};

#[test]
fn no_libnccl_means_nccl_unavailable_everywhere() {
    std::env::set_var("PTXFORGE_NCCL_LIB", "/nonexistent/dir/libnccl.so.2");
    let e = UniqueId::new().expect_err("no NCCL here");
    assert!(
        matches!(&e, NcclError::NcclUnavailable(w) if w.contains("/nonexistent/dir/libnccl.so.2")),
        "{e}"
    );
    assert!(matches!(
        netnccl::version(),
        Err(NcclError::NcclUnavailable(_))
    ));
    let id = UniqueId::from_bytes(&[7u8; 128]).expect("128 bytes");
    let dev = runtime::Device::emu(0);
    let e = Comm::init(&dev, &id, 0, 1).err().expect("no NCCL here");
    assert!(matches!(e, NcclError::NcclUnavailable(_)), "{e}");
    let e = UniqueId::from_bytes(&[0u8; 12]).expect_err("short id");
    assert!(e.to_string().contains("unique id"), "{e}");
}
