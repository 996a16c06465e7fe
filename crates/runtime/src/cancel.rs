//! Cancellation scopes: a flag that every emulator launch enqueued by this thread inside
//! [`with_scope`] watches, unless its [`crate::LaunchConfig::cancel`] names its own. Library
//! calls that launch many kernels (a GEMM, an expert-parallel dispatch) become interruptible as
//! a whole without a cancel parameter in every API: the Python bindings run such a call on a
//! worker thread inside a scope and set the flag on Ctrl-C. Launches then end with
//! `FaultKind::Interrupted`, and later launches of the scope end at once. CUDA kernels are not
//! interrupted (they run to their end).

use std::cell::RefCell;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

thread_local! {
    static SCOPE: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Runs `f` with `flag` as this thread's cancellation flag (nested scopes: the innermost wins;
/// the previous one is restored afterwards, also when `f` unwinds).
pub fn with_scope<T>(flag: Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<AtomicBool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            SCOPE.with(|s| *s.borrow_mut() = prev);
        }
    }
    let prev = SCOPE.with(|s| s.borrow_mut().replace(flag));
    let _restore = Restore(prev);
    f()
}

/// This thread's current cancellation flag, if it is inside a scope.
pub fn current() -> Option<Arc<AtomicBool>> {
    SCOPE.with(|s| s.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert!(current().is_none());
        let a = Arc::new(AtomicBool::new(false));
        let b = Arc::new(AtomicBool::new(true));
        with_scope(a.clone(), || {
            assert!(Arc::ptr_eq(&current().unwrap(), &a));
            with_scope(b.clone(), || assert!(Arc::ptr_eq(&current().unwrap(), &b)));
            assert!(Arc::ptr_eq(&current().unwrap(), &a));
        });
        assert!(current().is_none());
    }
}
