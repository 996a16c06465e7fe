//! Counts and alignments that do not fit their 32-bit fields are parse errors naming the
//! field, never truncated (`%r<4294967296>` used to print back as `%r<0>`).

fn module(decl: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry k()\n{{\n{decl}\nret;\n}}\n"
    )
}

#[test]
fn register_counts_must_fit_32_bits() {
    let e = ptx::parse(&module(".reg .b32 %r<4294967296>;")).unwrap_err();
    assert!(
        e.message
            .contains("register count 4294967296 does not fit in 32 bits"),
        "{}",
        e.message
    );
    assert_eq!(e.line, 6);
    // the largest count that fits is kept as written
    let m = ptx::parse(&module(".reg .b32 %r<4294967295>;")).unwrap();
    assert!(ptx::print(&m).contains("%r<4294967295>"));
}

#[test]
fn alignments_are_powers_of_two_that_fit_32_bits() {
    let e = ptx::parse(&module(".local .align 3 .b8 buf[16];")).unwrap_err();
    assert!(
        e.message.contains(".align 3 is not a power of two"),
        "{}",
        e.message
    );
    let e = ptx::parse(&module(".local .align 8589934592 .b8 buf[16];")).unwrap_err();
    assert!(
        e.message.contains(".align 8589934592 does not fit"),
        "{}",
        e.message
    );
    let m = ptx::parse(&module(".local .align 16 .b8 buf[16];")).unwrap();
    assert!(ptx::print(&m).contains(".align 16"));
}
