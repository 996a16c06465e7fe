//! One test per validator check: a small PTX snippet, the expected diagnostic kind and line.

use ptx::validate::{validate, DiagKind, Diagnostic, Severity};

/// Lines of the header [`module`] puts before the body.
const HEADER_LINES: u32 = 14;

fn module(target: &str, version: &str, body: &str) -> String {
    format!(
        ".version {version}
.target {target}
.address_size 64
.global .align 4 .b32 gvar;
.const .align 4 .b32 cvar;
.visible .entry k(
.param .u64 k_param_0
)
{{
.reg .pred %p<4>;
.reg .b16 %rs<4>;
.reg .b32 %r<16>;
.reg .f32 %f<16>;
.reg .b64 %rd<8>;
{body}
ret;
}}
"
    )
}

fn check_on(target: &str, version: &str, body: &str) -> Vec<Diagnostic> {
    let text = module(target, version, body);
    let m = ptx::parse(&text).unwrap_or_else(|e| panic!("snippet does not parse: {e}\n{text}"));
    validate(&m)
}

fn check(body: &str) -> Vec<Diagnostic> {
    check_on("sm_90a", "8.4", body)
}

/// Asserts exactly one error, of `kind`, on body line `line` (1-based).
#[track_caller]
fn expect(diags: &[Diagnostic], kind: DiagKind, line: u32) {
    let errs: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert_eq!(errs.len(), 1, "expected one {kind} error, got {errs:#?}");
    assert_eq!(errs[0].kind, kind, "{errs:#?}");
    assert_eq!(errs[0].line, HEADER_LINES + line, "{errs:#?}");
    assert_eq!(errs[0].function.as_deref(), Some("k"));
}

#[track_caller]
fn clean(diags: &[Diagnostic]) {
    let errs: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert!(errs.is_empty(), "{errs:#?}");
}

#[test]
fn clean_kernel_has_no_diagnostics() {
    let d = check(
        "ld.param.u64 %rd1, [k_param_0];
mov.u32 %r1, %tid.x;
mul.wide.u32 %rd2, %r1, 4;
add.s64 %rd3, %rd1, %rd2;
ld.global.f32 %f1, [%rd3];
setp.lt.u32 %p1, %r1, 32;
@%p1 bra $L__done;
add.f32 %f1, %f1, 0f3F800000;
st.global.f32 [%rd3], %f1;
$L__done:
shl.b32 %r2, %r1, 2;
selp.b32 %r3, %r1, %r2, %p1;
cvt.u16.u32 %rs1, %r1;
cvt.rn.f32.u16 %f2, %rs1;
st.global.v2.f32 [%rd3], {%f1, %f2};
ld.global.v4.b32 {%r4, %r5, _, %r7}, [%rd3];
mov.b64 %rd4, {%r1, %r2};
mov.b32 {%rs1, %rs2}, %r3;
shfl.sync.bfly.b32 %r8|%p2, %r1, 1, 31, -1;
ld.global.u8 %r9, [%rd3];",
    );
    clean(&d);
    assert!(d.is_empty(), "{d:#?}");
}

#[test]
fn undeclared_register() {
    expect(
        &check("mov.u32 %r1, 1;\nadd.s32 %r1, %r1, %q9;"),
        DiagKind::UndeclaredRegister,
        2,
    );
}

#[test]
fn range_declaration_bounds() {
    // %r<16> declares %r0..%r15.
    clean(&check("mov.u32 %r15, %r0;"));
    expect(&check("mov.u32 %r16, 1;"), DiagKind::UndeclaredRegister, 1);
}

#[test]
fn block_scoped_registers() {
    let body = "{\n.reg .b32 %inner;\nmov.u32 %inner, 1;\n}\nmov.u32 %r1, %inner;";
    expect(&check(body), DiagKind::UndeclaredRegister, 5);
    // Shadowing in a nested block is not a redeclaration.
    clean(&check("{\n.reg .f32 %r1;\nmov.f32 %r1, 0f00000000;\n}"));
}

#[test]
fn special_registers_are_declared() {
    clean(&check(
        "mov.u32 %r1, %ctaid.y;\nmov.u32 %r2, %laneid;\nmov.u64 %rd1, %clock64;",
    ));
}

#[test]
fn register_declared_twice() {
    expect(
        &check(".reg .b32 %x;\n.reg .f32 %x;"),
        DiagKind::DuplicateRegister,
        2,
    );
    expect(&check(".reg .b32 %r<4>;"), DiagKind::DuplicateRegister, 1);
    expect(&check(".reg .b32 %f3;"), DiagKind::DuplicateRegister, 1);
}

#[test]
fn float_operand_type_mismatch() {
    // f32 instruction with a 32-bit integer-typed... b32 is fine (bit type), u32 is not.
    clean(&check("add.f32 %f1, %f2, %f3;\nmov.b32 %r1, %f1;"));
    let d = check(".reg .u32 %u;\nadd.f32 %f1, %f2, %u;");
    expect(&d, DiagKind::TypeMismatch, 2);
    assert!(d[0].message.contains("%u"), "{}", d[0].message);
}

#[test]
fn width_mismatch() {
    expect(&check("add.s32 %r1, %r2, %rd1;"), DiagKind::TypeMismatch, 1);
    expect(&check("add.f32 %f1, %f2, %rs1;"), DiagKind::TypeMismatch, 1);
}

/// The uniform arithmetic and bit rows check every operand by the table's classes (the
/// validator's former "all operands have the type" rule), `min`/`max`'s optional third source
/// included; `mul.wide` keeps its own rule.
#[test]
fn table_classes_check_arithmetic_operands() {
    expect(
        &check("fma.rn.f32 %f1, %f2, %f3, %rd1;"),
        DiagKind::TypeMismatch,
        1,
    );
    let min3 = |body| check_on("sm_100", "8.8", body);
    expect(
        &min3("min.s32 %r1, %r2, %r3, %rd1;"),
        DiagKind::TypeMismatch,
        1,
    );
    clean(&min3("min.s32 %r1, %r2, %r3, %r4;"));
    expect(&check("sqrt.rn.f32 %rd1, %f1;"), DiagKind::TypeMismatch, 1);
    expect(
        &check("dp4a.u32.u32 %r1, %r2, %r3, %rd1;"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(
        &check("szext.clamp.u32 %r1, %r2, %rd1;"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(
        &check("mul.wide.u32 %r1, %r2, %r3;"),
        DiagKind::TypeMismatch,
        1,
    );
    clean(&check("mul.wide.u32 %rd1, %r2, %r3;"));
    let d = check("and.b32 %r1, %r2, %rd1;");
    expect(&d, DiagKind::TypeMismatch, 1);
    assert!(d[0].message.contains("source `%rd1`"), "{d:#?}");
}

#[test]
fn signed_unsigned_interchangeable() {
    clean(&check(
        ".reg .s32 %s;\n.reg .u32 %u;\nadd.u32 %u, %s, %u;\nadd.s32 %s, %u, %s;",
    ));
    // but floats must match exactly
    expect(
        &check(".reg .f64 %d;\nadd.f32 %f1, %f2, %d;"),
        DiagKind::TypeMismatch,
        2,
    );
}

#[test]
fn shift_amount_is_u32() {
    clean(&check("shl.b64 %rd1, %rd2, %r1;"));
    expect(
        &check("shl.b64 %rd1, %rd2, %rd3;"),
        DiagKind::TypeMismatch,
        1,
    );
}

#[test]
fn wide_multiply_doubles_destination() {
    clean(&check(
        "mul.wide.s32 %rd1, %r1, %r2;\nmad.wide.u32 %rd2, %r1, %r2, %rd1;",
    ));
    expect(
        &check("mul.wide.s32 %r3, %r1, %r2;"),
        DiagKind::TypeMismatch,
        1,
    );
}

#[test]
fn cvt_uses_its_own_types() {
    clean(&check(
        "cvt.rn.f32.s32 %f1, %r1;\ncvt.u64.u32 %rd1, %r1;\ncvt.rn.bf16.f32 %rs1, %f1;",
    ));
    expect(
        &check("cvt.rn.f32.s32 %f1, %f2;"),
        DiagKind::TypeMismatch,
        1,
    );
}

#[test]
fn setp_destination_is_predicate() {
    clean(&check(
        "setp.lt.s32 %p1, %r1, %r2;\nsetp.eq.f32 %p1|%p2, %f1, %f2;",
    ));
    expect(
        &check("setp.lt.s32 %r3, %r1, %r2;"),
        DiagKind::TypeMismatch,
        1,
    );
}

#[test]
fn selp_selector_is_predicate() {
    expect(
        &check("selp.b32 %r1, %r2, %r3, %r4;"),
        DiagKind::TypeMismatch,
        1,
    );
    clean(&check("slct.s32.s32 %r1, %r2, %r3, %r4;"));
}

#[test]
fn ld_value_against_instruction_type() {
    expect(
        &check("ld.global.f32 %rs1, [%rd2];"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(
        &check(".reg .f64 %d;\nld.global.f32 %d, [%rd2];"),
        DiagKind::TypeMismatch,
        2,
    );
    expect(
        &check("st.global.f32 [%rd2], %rs1;"),
        DiagKind::TypeMismatch,
        1,
    );
    // narrow integer loads into wide registers are fine
    clean(&check(
        "ld.global.u8 %r1, [%rd2];\nst.global.b16 [%rd2], %r1;",
    ));
}

#[test]
fn vector_operand_counts() {
    expect(
        &check("ld.global.v4.f32 {%f1, %f2}, [%rd1];"),
        DiagKind::VectorWidth,
        1,
    );
    expect(
        &check("st.global.v2.f32 [%rd1], %f1;"),
        DiagKind::VectorWidth,
        1,
    );
}

#[test]
fn mma_fragments() {
    let ok = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1, %f2, %f3, %f4};";
    clean(&check(ok));
    let short_a = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3}, {%r5, %r6}, {%f1, %f2, %f3, %f4};";
    expect(&check(short_a), DiagKind::MmaFragment, 1);
    let int_c = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%rs0, %rs1, %rs2, %rs3};";
    expect(&check(int_c), DiagKind::MmaFragment, 1);
    let tf32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5}, {%f1, %f2, %f3, %f4};";
    expect(&check(tf32), DiagKind::MmaFragment, 1);
}

#[test]
fn wgmma_operands() {
    let d32: Vec<String> = (0..32).map(|i| format!("%f{}", i % 16)).collect();
    let d = format!("{{{}}}", d32.join(", "));
    let ok = format!(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {d}, %rd1, %rd2, %p1, 1, 1, 0, 1;"
    );
    clean(&check(&ok));
    // Triton's form: b32 accumulators, an immediate scale-d; FP8 k32 and register A
    let bits = format!(
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {}, %rd1, %rd2, 1, 1, 1;",
        d.replace("%f", "%r")
    );
    clean(&check(&bits));
    let reg_a = format!("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {d}, {{%r1, %r2, %r3, %r4}}, %rd2, %p1, 1, 1, 1;");
    clean(&check(&reg_a));
    // 16 accumulators for N = 64 (needs 32)
    let short: Vec<String> = (0..16).map(|i| format!("%f{i}")).collect();
    let bad_d = format!(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{}}}, %rd1, %rd2, %p1, 1, 1, 0, 1;",
        short.join(", ")
    );
    expect(&check(&bad_d), DiagKind::MmaFragment, 1);
    // K must be 32 for e4m3; N a multiple of 8
    let bad_k =
        format!("wgmma.mma_async.sync.aligned.m64n64k16.f32.e4m3.e4m3 {d}, %rd1, %rd2, 1, 1, 1;");
    expect(&check(&bad_k), DiagKind::MmaFragment, 1);
    let bad_n = "wgmma.mma_async.sync.aligned.m64n12k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4, %f5, %f6}, %rd1, %rd2, %p1, 1, 1, 0, 1;";
    expect(&check(bad_n), DiagKind::MmaFragment, 1);
    // descriptors are 64-bit, scale-d a predicate
    let bad_desc = format!(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {d}, %rd1, %r2, %p1, 1, 1, 0, 1;"
    );
    expect(&check(&bad_desc), DiagKind::MmaFragment, 1);
    let bad_scale = format!(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {d}, %rd1, %rd2, %r1, 1, 1, 0, 1;"
    );
    expect(&check(&bad_scale), DiagKind::MmaFragment, 1);
    let bad_a = format!("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {d}, {{%r1, %r2}}, %rd2, %p1, 1, 1, 1;");
    expect(&check(&bad_a), DiagKind::MmaFragment, 1);
}

#[test]
fn fence_operands() {
    clean(&check(
        "fence.proxy.tensormap::generic.acquire.sys [%rd1], 128;",
    ));
    clean(&check("fence.acq_rel.gpu;"));
    expect(
        &check("fence.acq_rel.gpu [%rd1], 128;"),
        DiagKind::OperandCount,
        1,
    );
    expect(
        &check("fence.proxy.tensormap::generic.acquire.sys [%rd1];"),
        DiagKind::OperandCount,
        1,
    );
}

#[test]
fn guard_must_be_predicate() {
    expect(&check("@%r1 bra $L;\n$L:"), DiagKind::GuardNotPredicate, 1);
    expect(&check("@%nope ret;"), DiagKind::UndeclaredRegister, 1);
}

#[test]
fn operand_counts() {
    expect(&check("add.s32 %r1, %r2;"), DiagKind::OperandCount, 1);
    expect(&check("mov.u32 %r1, %r2, %r3;"), DiagKind::OperandCount, 1);
}

#[test]
fn immediate_destination() {
    expect(&check("add.s32 5, %r2, %r3;"), DiagKind::BadOperand, 1);
}

#[test]
fn ld_param_of_non_param_symbol() {
    expect(&check("ld.param.b32 %r1, [gvar];"), DiagKind::StateSpace, 1);
}

#[test]
fn store_to_const() {
    expect(&check("st.const.b32 [cvar], %r1;"), DiagKind::StateSpace, 1);
}

#[test]
fn space_mismatch_on_symbol() {
    expect(
        &check("ld.shared.b32 %r1, [gvar];"),
        DiagKind::StateSpace,
        1,
    );
    clean(&check(
        "ld.global.b32 %r1, [gvar+4];\nld.const.b32 %r2, [cvar];",
    ));
}

#[test]
fn param_entry_in_func() {
    let text = ".version 8.0\n.target sm_80\n.address_size 64\n.func f(.param .b32 a)\n{\n.reg .b32 %r1;\nld.param::entry.b32 %r1, [a];\nret;\n}\n";
    let d = validate(&ptx::parse(text).unwrap());
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!((d[0].kind, d[0].line), (DiagKind::StateSpace, 7));
}

#[test]
fn store_to_kernel_param() {
    expect(
        &check("st.param.u64 [k_param_0], %rd1;"),
        DiagKind::StateSpace,
        1,
    );
}

#[test]
fn unknown_symbol_in_address() {
    expect(
        &check("ld.global.b32 %r1, [nosuch];"),
        DiagKind::UnknownSymbol,
        1,
    );
    expect(&check("mov.u64 %rd1, nosuch;"), DiagKind::UnknownSymbol, 1);
}

#[test]
fn missing_and_duplicate_labels() {
    expect(&check("bra $L__nowhere;"), DiagKind::UndefinedLabel, 1);
    expect(
        &check("$A:\nmov.u32 %r1, 0;\n$A:"),
        DiagKind::DuplicateLabel,
        3,
    );
}

#[test]
fn labels_are_scoped_to_their_block() {
    // The same inline-asm loop twice (as Triton emits mbarrier waits): one name per block.
    let wait = "{\nspin:\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 bra.uni spin;\n}";
    clean(&check(&format!("{wait}\n{wait}")));
    // ... and a block may reuse a function-scope name.
    clean(&check(&format!("spin:\nmov.u32 %r1, 1;\n{wait}")));
    // Twice within one block is still an error.
    expect(
        &check("{\n$A:\nmov.u32 %r1, 0;\n$A:\n}"),
        DiagKind::DuplicateLabel,
        4,
    );
}

#[test]
fn wgmma_needs_sm90a() {
    let d = check_on("sm_80", "8.4", "wgmma.fence.sync.aligned;");
    expect(&d, DiagKind::TargetUnsupported, 1);
    assert_eq!(
        d[0].message,
        "wgmma.fence requires sm_90a, module targets sm_80"
    );
    let d = check_on("sm_90", "8.4", "wgmma.commit_group.sync.aligned;");
    expect(&d, DiagKind::TargetUnsupported, 1);
}

#[test]
fn wgmma_mma_async_message() {
    let body = "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4}, %rd1, %rd2, 1, 1, 1, 0, 0;";
    let d = check_on("sm_80", "8.4", body);
    let t: Vec<_> = d
        .iter()
        .filter(|d| d.kind == DiagKind::TargetUnsupported)
        .collect();
    assert_eq!(t.len(), 1, "{d:#?}");
    assert_eq!(
        t[0].message,
        "wgmma.mma_async requires sm_90a, module targets sm_80"
    );
    assert_eq!(t[0].line, HEADER_LINES + 1);
}

#[test]
fn cp_async_on_sm75() {
    let d = check_on(
        "sm_75",
        "8.0",
        ".shared .align 16 .b8 buf[64];\ncp.async.cg.shared.global [buf], [%rd1], 16;",
    );
    expect(&d, DiagKind::TargetUnsupported, 2);
    assert!(d[0].message.contains("requires sm_80"), "{}", d[0].message);
}

#[test]
fn fp8_mma_on_sm80() {
    let body = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1, %f2, %f3, %f4};";
    clean(&check_on("sm_89", "8.4", body));
    let d = check_on("sm_80", "8.4", body);
    expect(&d, DiagKind::TargetUnsupported, 1);
    assert!(d[0].message.contains("requires sm_89"), "{}", d[0].message);
}

#[test]
fn ptx_version_too_old() {
    expect(
        &check_on("sm_90a", "7.0", "griddepcontrol.wait;"),
        DiagKind::PtxVersion,
        1,
    );
}

#[test]
fn reqntid_over_1024() {
    let text = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry big()\n.reqntid 64, 32, 1\n{\nret;\n}\n";
    let d = validate(&ptx::parse(text).unwrap());
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!((d[0].kind, d[0].line), (DiagKind::ThreadCount, 4));
    assert!(d[0].message.contains("2048"), "{}", d[0].message);
}

#[test]
fn several_diagnostics_per_run() {
    let d =
        check("add.s32 %r1, %r2, %zz;\nbra $nowhere;\n.reg .b32 %r<2>;\nadd.f32 %f1, %rd1, %f2;");
    let kinds: Vec<(DiagKind, u32)> = d.iter().map(|d| (d.kind, d.line - HEADER_LINES)).collect();
    assert_eq!(
        kinds,
        vec![
            (DiagKind::UndeclaredRegister, 1),
            (DiagKind::UndefinedLabel, 2),
            (DiagKind::DuplicateRegister, 3),
            (DiagKind::TypeMismatch, 4)
        ]
    );
}

#[test]
fn diagnostics_serialise_and_display() {
    let d = check("bra $nowhere;");
    let s = d[0].to_string();
    assert!(
        s.starts_with(&format!("{}:1: error: ", HEADER_LINES + 1)),
        "{s}"
    );
    let j = serde_json::to_value(&d[0]).unwrap();
    assert_eq!(j["kind"], "undefined_label");
    assert_eq!(j["severity"], "error");
    assert_eq!(j["function"], "k");
}

#[test]
fn integer_immediate_in_float_instruction() {
    let d = check("add.f32 %f1, %f2, 1;");
    expect(&d, DiagKind::TypeMismatch, 1);
    assert!(d[0].message.contains("integer immediate `1`"), "{d:#?}");
    expect(
        &check("mov.f32 %f1, 0f3F800000;\nsetp.lt.f32 %p1, %f1, 0;"),
        DiagKind::TypeMismatch,
        2,
    );
    expect(
        &check("fma.rn.f32 %f1, %f2, 2, %f3;"),
        DiagKind::TypeMismatch,
        1,
    );
}

#[test]
fn float_immediate_in_integer_instruction() {
    expect(
        &check("add.u32 %r1, %r2, 0f3F800000;"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(&check("add.s32 %r1, %r2, 1.5;"), DiagKind::TypeMismatch, 1);
}

#[test]
fn matching_immediates_and_bit_types_are_clean() {
    clean(&check(
        "add.f32 %f1, %f2, 0f3F800000;
add.f32 %f1, %f2, 1.5;
add.u32 %r1, %r2, 7;
mov.b32 %r1, 0f3F800000;
mov.b32 %r1, 7;
setp.lt.f32 %p1, %f1, 0f00000000;",
    ));
}

#[test]
fn carry_flag_forms() {
    clean(&check(
        "add.cc.u32 %r1, %r2, %r3;\naddc.cc.s32 %r1, %r2, %r3;\nsub.cc.u64 %rd1, %rd2, %rd3;\nsubc.s64 %rd1, %rd2, %rd3;\nmad.lo.cc.u32 %r1, %r2, %r3, %r4;\nmadc.hi.cc.s64 %rd1, %rd2, %rd3, %rd4;",
    ));
    expect(
        &check("add.cc.f32 %f1, %f2, %f3;"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(
        &check("addc.u16 %rs1, %rs2, %rs3;"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(
        &check("mad.cc.u32 %r1, %r2, %r3, %r4;"),
        DiagKind::BadOperand,
        1,
    );
    expect(
        &check("madc.u32 %r1, %r2, %r3, %r4;"),
        DiagKind::BadOperand,
        1,
    );
    expect(
        &check("mul.lo.cc.u32 %r1, %r2, %r3;"),
        DiagKind::BadOperand,
        1,
    );
}

#[test]
fn forward_declaration_does_not_shadow_the_definition() {
    let text = ".version 8.0
.target sm_80
.address_size 64
.func (.param .b32 rv) f(.param .b32 x);
.visible .entry k()
{
.reg .b32 %r<2>;
{
.param .b32 param0;
st.param.b32 [param0], 1;
.param .b32 retval0;
call.uni (retval0), f, (param0);
ld.param.b32 %r1, [retval0];
}
ret;
}
.func (.param .b32 rv) f(.param .b32 x)
{
.reg .b32 %r<2>;
ld.param.b32 %r1, [x];
st.param.b32 [rv], %r1;
ret;
}
";
    let m = ptx::parse(text).unwrap();
    let f = m.function("f").unwrap();
    assert!(f.body.is_some(), "the definition, not the declaration");
    clean(&validate(&m));
}

/// A call needs the callee declared (or defined) earlier in the module, as ptxas requires
/// ("Call to 'g' requires call prototype"); a forward declaration makes the same call valid,
/// and a function may call itself.
#[test]
fn call_before_declaration() {
    let callee = ".func (.param .b32 out) g(.param .b32 in)
{
.reg .b32 %x;
ld.param.b32 %x, [in];
setp.eq.s32 %p, %x, 0;
@%p bra DONE;
{
.param .b32 a;
.param .b32 r;
st.param.b32 [a], 0;
call (r), g, (a);
}
DONE:
st.param.b32 [out], %x;
ret;
}
";
    let kernel = ".visible .entry k()
{
.reg .b32 %r<2>;
.param .b32 a;
.param .b32 r;
st.param.b32 [a], 5;
call (r), g, (a);
ld.param.b32 %r1, [r];
ret;
}
";
    let head = ".version 8.0\n.target sm_80\n.address_size 64\n";
    let callee = callee.replace(".reg .b32 %x;", ".reg .b32 %x;\n.reg .pred %p;");
    let late = format!("{head}{kernel}{callee}");
    let d = validate(&ptx::parse(&late).unwrap());
    let errs: Vec<&Diagnostic> = d.iter().filter(|d| d.severity == Severity::Error).collect();
    assert_eq!(errs.len(), 1, "{d:?}");
    assert_eq!(errs[0].kind, DiagKind::UnknownSymbol);
    assert_eq!(errs[0].line, 10, "{d:?}");
    assert!(errs[0].message.contains("before its declaration"), "{d:?}");

    let proto = ".func (.param .b32 out) g(.param .b32 in);\n";
    let declared = format!("{head}{proto}{kernel}{callee}");
    let d = validate(&ptx::parse(&declared).unwrap());
    assert!(d.iter().all(|d| d.severity != Severity::Error), "{d:?}");
    let defined_first = format!("{head}{callee}{kernel}");
    let d = validate(&ptx::parse(&defined_first).unwrap());
    assert!(d.iter().all(|d| d.severity != Severity::Error), "{d:?}");
}

/// Operand counts and types come from the table's role lists, which follow the modifiers: a
/// multicast tensor copy needs its `ctaMask`, a cache-hinted access its 64-bit policy (and the
/// policy is not checked as a value of the access type).
#[test]
fn role_lists_follow_the_modifiers() {
    let load = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes";
    expect(
        &check(&format!(
            "{load}.multicast::cluster [%r1], [%rd1, {{%r2, %r3}}], [%r4];"
        )),
        DiagKind::OperandCount,
        1,
    );
    clean(&check(&format!(
        "{load}.multicast::cluster [%r1], [%rd1, {{%r2, %r3}}], [%r4], %rs1;"
    )));
    expect(
        &check(&format!("{load} [%r1], [%rd1, {{%r2, %r3}}];")),
        DiagKind::OperandCount,
        1,
    );
    clean(&check(
        "atom.global.L2::cache_hint.add.u32 %r1, [%rd1], %r2, %rd2;",
    ));
    expect(
        &check("atom.global.L2::cache_hint.add.u32 %r1, [%rd1], %r2, %r3;"),
        DiagKind::TypeMismatch,
        1,
    );
    expect(
        &check("shfl.sync.bfly.b32 %r1, %r2, %f1, 31, -1;"),
        DiagKind::TypeMismatch,
        1,
    );
    clean(&check(
        "mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], %r2, %r3;\n\
         mbarrier.arrive.expect_tx.shared::cta.b64 %rd1, [%r1], %r2;",
    ));
    expect(
        &check("bfi.b32 %r1, %r2, %r3, %f1, 8;"),
        DiagKind::TypeMismatch,
        1,
    );
}

/// Type classes that do not depend on the instruction's type are checked on instructions
/// without a type modifier too.
#[test]
fn untyped_instructions_check_their_table_types() {
    clean(&check("bar.warp.sync -1;\nelect.sync %r1|%p1, -1;"));
    expect(&check("bar.warp.sync %f1;"), DiagKind::TypeMismatch, 1);
}

/// Integer and `.rna` roundings belong to `cvt` (the builder's `Rnd` is `ptx::ops::Rounding`,
/// so this is where a misused one is caught).
#[test]
fn integer_rounding_only_on_cvt() {
    clean(&check(
        "add.rn.f32 %f1, %f2, %f3;\ncvt.rni.f32.f32 %f1, %f2;\ncvt.rzi.s32.f32 %r1, %f2;",
    ));
    expect(
        &check("add.rni.f32 %f1, %f2, %f3;"),
        DiagKind::BadOperand,
        1,
    );
    expect(
        &check("fma.rna.f32 %f1, %f2, %f3, %f4;"),
        DiagKind::BadOperand,
        1,
    );
}
