//! Parser, printer and validator of vector registers, vector `.reg` parameters, several return
//! values, indirect calls and `WARP_SZ` (the emulator runs them in `crates/emu/tests/isa_func.rs`).

use ptx::validate::{validate, DiagKind};
use ptx::{Item, Operand, SReg, Space, Statement};

const MODULE: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .v2 .f32 %r, .reg .b32 %q) vf(.reg .v4 .b32 %a, .reg .f32 %s)
{
    .reg .f32 %t;
    mov.b32 %t, %a.y;
    add.f32 %r.x, %t, %s;
    mov.b32 %r.g, %a.a;
    xor.b32 %q, %a.x, %a.z;
    ret;
}

.visible .entry k(.param .u64 pout)
{
    .reg .v4 .b32 %v;
    .reg .v2 .f32 %o;
    .reg .v4 .f32 V;
    .reg .b32 %q;
    .reg .f32 %f;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [pout];
    ld.global.v4.b32 %v, [%rd1];
    ld.global.v4.f32 V, [%rd1+16];
    add.f32 %f, V.x, V.w;
    mov.v4.b32 {%q, _, %q, _}, %v;
    add.u32 %q, %q, WARP_SZ;
    call (%o, %q), vf, (%v, %f);
    mov.u64 %rd2, vf;
    {
    .param .b32 retval0;
    .param .b32 param0;
    proto : .callprototype (.param .b32 _) _ (.param .b32 _);
    call (retval0), %rd2, (param0), proto;
    }
    st.global.v2.f32 [%rd1], %o;
    ret;
}
"#;

#[test]
fn vector_components_params_warp_sz_and_indirect_calls_parse_print_and_validate() {
    let m = ptx::parse(MODULE).unwrap();
    let text = ptx::print(&m);
    assert_eq!(
        ptx::parse(&text).unwrap(),
        m,
        "parse(print(m)) != m:\n{text}"
    );
    for s in [
        "(.reg .v2 .f32 %r,.reg .b32 %q) vf(.reg .v4 .b32 %a,.reg .f32 %s)",
        "mov.b32 %r.g, %a.a;",
        "add.f32 %f, V.x, V.w;",
        "add.u32 %q, %q, WARP_SZ;",
        "call (retval0), %rd2, (param0), proto;",
    ] {
        assert!(text.contains(s), "`{s}` not printed:\n{text}");
    }
    let diags = validate(&m);
    assert!(diags.is_empty(), "{diags:#?}");
    let Some(Item::Func(vf)) = m.items.first() else {
        panic!("no function")
    };
    assert_eq!(vf.rets[0].vec, Some(2));
    assert_eq!(vf.rets[0].size_bytes(), 8);
    assert_eq!(vf.params[0].vec, Some(4));
    assert_eq!(vf.params[0].space, Space::Reg);
    let k = m.function("k").unwrap();
    let ins = k.instructions();
    // a register declared without `%` and its component become registers
    assert_eq!(ins[3].args[1], Operand::reg("V.x"));
    assert_eq!(ins[5].args[2], Operand::SReg(SReg::WarpSz));
    assert!(matches!(
        k.body
            .as_ref()
            .unwrap()
            .iter()
            .find(|s| matches!(s, Statement::Block(_))),
        Some(Statement::Block(_))
    ));
}

#[test]
fn component_helper_maps_xyzw_and_rgba() {
    for (n, want) in [
        ("%v.x", 0),
        ("%v.g", 1),
        ("%v.b", 2),
        ("%v.w", 3),
        ("V.a", 3),
    ] {
        assert_eq!(ptx::split_component(n).map(|p| p.1), Some(want), "{n}");
    }
    assert_eq!(ptx::split_component("%v"), None);
    assert_eq!(ptx::split_component("%tid.q"), None);
}

/// Validates `MODULE` with `from` replaced by `to`; returns the kinds found.
fn kinds_after(from: &str, to: &str) -> Vec<DiagKind> {
    assert!(MODULE.contains(from), "{from}");
    let m = ptx::parse(&MODULE.replace(from, to)).unwrap();
    validate(&m).iter().map(|d| d.kind).collect()
}

#[test]
fn validator_rejects_what_ptxas_rejects() {
    // a component past the vector's width
    assert!(kinds_after("mov.b32 %r.g, %a.a;", "mov.b32 %r.b, %a.a;")
        .contains(&DiagKind::UndeclaredRegister));
    // several return values that are not all .reg
    assert!(kinds_after(
        ".func (.reg .v2 .f32 %r, .reg .b32 %q)",
        ".func (.reg .v2 .f32 %r, .param .b32 q)"
    )
    .contains(&DiagKind::BadOperand));
    // `_` as a source element
    assert!(kinds_after(
        "st.global.v2.f32 [%rd1], %o;",
        "st.global.v2.f32 [%rd1], {%f, _};"
    )
    .contains(&DiagKind::BadOperand));
    // vectors in .param space
    assert!(kinds_after("vf(.reg .v4 .b32 %a,", "vf(.param .v4 .b32 a,")
        .contains(&DiagKind::BadOperand));
    assert!(
        kinds_after(".param .b32 param0;", ".param .v2 .b32 param0;")
            .contains(&DiagKind::BadOperand)
    );
    // a vector move whose sides differ in width
    assert!(kinds_after(
        "mov.v4.b32 {%q, _, %q, _}, %v;",
        "mov.v4.b32 {%q, _, %q}, %v;"
    )
    .contains(&DiagKind::VectorWidth));
    // a whole vector register where a v2 is expected
    assert!(kinds_after(
        "st.global.v2.f32 [%rd1], %o;",
        "st.global.v2.f32 [%rd1], %v;"
    )
    .contains(&DiagKind::VectorWidth));
}

#[test]
fn predefined_identifiers_parse_and_print() {
    for name in [
        "WARP_SZ",
        "%pm0",
        "%pm7",
        "%pm2_64",
        "%reserved_smem_offset_begin",
        "%reserved_smem_offset_end",
        "%reserved_smem_offset_cap",
        "%reserved_smem_offset_0",
        "%reserved_smem_offset_1",
        "%current_graph_exec",
    ] {
        let r = SReg::parse(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(r.name(), name);
    }
    for bad in ["%pm8", "%pm01", "%pm8_64", "%pm", "%reserved_smem_offset_2"] {
        assert_eq!(SReg::parse(bad), None, "{bad}");
    }
}

#[test]
fn registers_named_like_predefined_identifiers_shadow_them() {
    let text = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pout)
{
    .reg .b32 %pm<2>;
    .reg .b32 WARP_SZ;
    .reg .b32 %r;
    mov.u32 %pm1, 5;
    mov.u32 WARP_SZ, %pm1;
    mov.u32 %r, %pm0;
    ret;
}
"#;
    let m = ptx::parse(text).unwrap();
    assert_eq!(ptx::parse(&ptx::print(&m)).unwrap(), m);
    let ins = m.function("k").unwrap().instructions();
    assert_eq!(ins[0].args[0], Operand::reg("%pm1"));
    assert_eq!(
        ins[1].args,
        vec![Operand::reg("WARP_SZ"), Operand::reg("%pm1")]
    );
    assert_eq!(ins[2].args[1], Operand::reg("%pm0"));
    assert!(validate(&m).is_empty(), "{:#?}", validate(&m));
}
