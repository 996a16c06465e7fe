//! The Hopper tensor-memory-access forms of issue 16 item 3 that came with the im2col and
//! tensor-map work: `cp.async.bulk.tensor` im2col loads (3d/4d/5d, multicast, cache hint),
//! `cp.async.bulk.prefetch.tensor` im2col, `.im2col_no_offs` / `.tile` stores and reductions,
//! `tensormap.replace` (every field, both spaces), `tensormap.cp_fenceproxy` and the
//! `fence.proxy.tensormap::generic` release/acquire fences at every scope. Each kernel parses,
//! validates without errors, prints back to the same module, and (with ptxas) assembles for
//! the target the instruction table says it needs, and not for the target below.

const IM2COL: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 tm)
{
    .reg .b32 %r<16>;
    .reg .b16 %h<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [tm];
    cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r1, %r2, %r3}], [%r4], {%h1};
    cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r1, %r2, %r3, %r5}], [%r4], {%h1, %h2};
    cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster [%r1], [%rd1, {%r1, %r2, %r3, %r5, %r6}], [%r4], {%h1, %h2, %h3}, %h4;
    cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint [%r1], [%rd1, {%r1, %r2, %r3, %r5, %r6}], [%r4], {%h1, %h2, %h3}, %h4, %rd2;
    cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.L2::cache_hint [%r1], [%rd1, {%r1, %r2, %r3, %r5}], [%r4], {%h1, %h2}, %rd2;
    cp.async.bulk.prefetch.tensor.4d.L2.global.im2col [%rd1, {%r1, %r2, %r3, %r5}], {%h1, %h2};
    cp.async.bulk.prefetch.tensor.5d.L2.global.im2col.L2::cache_hint [%rd1, {%r1, %r2, %r3, %r5, %r6}], {%h1, %h2, %h3}, %rd2;
    cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.im2col_no_offs.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];
    cp.reduce.async.bulk.tensor.3d.global.shared::cta.min.tile.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];
    cp.reduce.async.bulk.tensor.4d.global.shared::cta.max.im2col_no_offs.bulk_group [%rd1, {%r1, %r2, %r3, %r5}], [%r4];
    cp.reduce.async.bulk.tensor.5d.global.shared::cta.xor.im2col_no_offs.bulk_group.L2::cache_hint [%rd1, {%r1, %r2, %r3, %r5, %r6}], [%r4], %rd2;
    cp.async.bulk.tensor.3d.global.shared::cta.im2col_no_offs.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];
    cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%rd1, {%r1, %r2, %r3, %r5, %r6}], [%r4];
    ret;
}
"#;

const TENSORMAP: &str = r#"
.version 8.3
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 tm)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .shared .align 128 .b8 sm[128];
    ld.param.u64 %rd1, [tm];
    mov.u64 %rd2, sm;
    tensormap.replace.tile.global_address.shared::cta.b1024.b64 [sm], %rd3;
    tensormap.replace.tile.global_address.global.b1024.b64 [%rd1], %rd3;
    tensormap.replace.tile.rank.shared::cta.b1024.b32 [sm], 2;
    tensormap.replace.tile.rank.global.b1024.b32 [%rd1], %r2;
    tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [sm], 1, %r1;
    tensormap.replace.tile.box_dim.global.b1024.b32 [%rd1], 4, 64;
    tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [sm], 0, %r1;
    tensormap.replace.tile.global_dim.global.b1024.b32 [%rd1], 3, %r1;
    tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [sm], 0, %rd3;
    tensormap.replace.tile.global_stride.global.b1024.b64 [%rd1], 3, %rd3;
    tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [sm], 1, %r1;
    tensormap.replace.tile.element_stride.global.b1024.b32 [%rd1], 0, 2;
    tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [sm], 7;
    tensormap.replace.tile.elemtype.global.b1024.b32 [%rd1], 10;
    tensormap.replace.tile.interleave_layout.shared::cta.b1024.b32 [sm], 0;
    tensormap.replace.tile.interleave_layout.global.b1024.b32 [%rd1], 1;
    tensormap.replace.tile.swizzle_mode.shared::cta.b1024.b32 [sm], 3;
    tensormap.replace.tile.swizzle_mode.global.b1024.b32 [%rd1], 2;
    tensormap.replace.tile.fill_mode.shared::cta.b1024.b32 [sm], 1;
    tensormap.replace.tile.fill_mode.global.b1024.b32 [%rd1], 0;
    tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%rd2], %rd3;
    tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.cta.sync.aligned [%rd1], [sm], 128;
    tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.cluster.sync.aligned [%rd1], [sm], 128;
    tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%rd1], [sm], 128;
    tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.sys.sync.aligned [%rd1], [%rd2], 128;
    fence.proxy.tensormap::generic.release.cta;
    fence.proxy.tensormap::generic.release.cluster;
    fence.proxy.tensormap::generic.release.gpu;
    fence.proxy.tensormap::generic.release.sys;
    fence.proxy.tensormap::generic.acquire.cta [%rd1], 128;
    fence.proxy.tensormap::generic.acquire.cluster [%rd1], 128;
    fence.proxy.tensormap::generic.acquire.gpu [%rd1], 128;
    fence.proxy.tensormap::generic.acquire.sys [%rd1], 128;
    ret;
}
"#;

fn check(text: &str) -> ptx::Module {
    let m = ptx::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let errs = ptx::validate::validate_errors(&m);
    assert!(errs.is_empty(), "validator errors: {errs:?}");
    let again = ptx::parse(&ptx::print(&m)).unwrap();
    assert_eq!(again, m, "parse(print(m)) != m");
    m
}

/// The lowest target and PTX version the table asks for over all instructions of `m`.
fn needs(m: &ptx::Module) -> ptx::isa::Requirement {
    let mut r = ptx::isa::Requirement {
        min_sm: 0,
        min_ptx: 0,
        arch_specific: false,
    };
    for f in m.functions() {
        for ins in f.instructions().into_iter() {
            let q = ptx::isa::requirement(ins);
            r.min_sm = r.min_sm.max(q.min_sm);
            r.min_ptx = r.min_ptx.max(q.min_ptx);
            r.arch_specific |= q.arch_specific;
        }
    }
    r
}

fn ptxas(text: &str, target: &str) -> Result<(), String> {
    ptx::ptxas::assemble(text, target, &Default::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn im2col_forms_parse_validate_round_trip_and_assemble() {
    let m = check(IM2COL);
    let r = needs(&m);
    assert_eq!((r.min_sm, r.min_ptx, r.arch_specific), (90, 80, false));
    if ptx::ptxas::ptxas_for_tests("TMA im2col forms").is_some() {
        ptxas(IM2COL, "sm_90a").unwrap();
        ptxas(&IM2COL.replace("sm_90a", "sm_90"), "sm_90").unwrap();
        let old = IM2COL.replace(".version 8.0", ".version 7.8");
        assert!(ptxas(&old, "sm_90a").is_err(), "ptxas took TMA at PTX 7.8");
    }
}

#[test]
fn tensormap_forms_parse_validate_round_trip_and_assemble() {
    let m = check(TENSORMAP);
    let r = needs(&m);
    assert_eq!((r.min_sm, r.min_ptx, r.arch_specific), (90, 83, true));
    let fields: Vec<_> = m
        .functions()
        .next()
        .unwrap()
        .instructions()
        .into_iter()
        .filter_map(|i| i.tensormap_field())
        .collect();
    assert_eq!(fields.len(), 21);
    for f in ptx::ops::TensormapField::ALL {
        assert!(fields.contains(f), "{f} not exercised");
    }
    if ptx::ptxas::ptxas_for_tests("tensormap forms").is_some() {
        ptxas(TENSORMAP, "sm_90a").unwrap();
        let e = ptxas(&TENSORMAP.replace("sm_90a", "sm_90"), "sm_90").unwrap_err();
        assert!(e.contains("tensormap.replace"), "{e}");
        let old = TENSORMAP.replace(".version 8.3", ".version 8.2");
        assert!(
            ptxas(&old, "sm_90a").is_err(),
            "ptxas took tensormap at PTX 8.2"
        );
    }
}

/// A per-dimension field without its `ord`, or a whole-map field with one, is an operand-count
/// error naming the instruction.
#[test]
fn tensormap_replace_operand_counts() {
    let bad = TENSORMAP.replace(
        "tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [sm], 1, %r1;",
        "tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [sm], %r1;",
    );
    let m = ptx::parse(&bad).unwrap();
    let errs = ptx::validate::validate_errors(&m);
    assert!(
        errs.iter()
            .any(|d| d.to_string().contains("tensormap.replace")),
        "{errs:?}"
    );
}

/// What ptxas refuses among the TMA forms, the validator refuses too, naming the instruction:
/// `.im2col` on a store, `.im2col_no_offs` on a load, a wrong offset count, a 2d im2col copy,
/// and a `cp_fenceproxy` size other than the immediate 128.
#[test]
fn wrong_tma_forms_are_refused() {
    let body = |line: &str| {
        format!(
            ".version 8.3\n.target sm_90a\n.address_size 64\n.visible .entry k(.param .u64 tm)\n{{\n\
             .reg .b32 %r<8>;\n.reg .b16 %h<4>;\n.reg .b64 %rd<4>;\n.shared .align 128 .b8 sm[128];\n\
             ld.param.u64 %rd1, [tm];\n{line}\nret;\n}}\n"
        )
    };
    for (line, why) in [
        // (`.im2col` asks for the offsets operand: an operand-count error first)
        ("cp.async.bulk.tensor.3d.global.shared::cta.im2col.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];", "takes 3 operands"),
        ("cp.async.bulk.tensor.3d.global.shared::cta.im2col.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4], {%h1};", "is for loads"),
        ("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.im2col.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];", "is for loads"),
        ("cp.async.bulk.tensor.3d.shared::cluster.global.im2col_no_offs.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r1, %r2, %r3}], [%r4];", "is for stores"),
        ("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r1, %r2, %r3, %r5}], [%r4], {%h1};", "takes 2 offsets, found 1"),
        ("cp.async.bulk.tensor.2d.global.shared::cta.im2col_no_offs.bulk_group [%rd1, {%r1, %r2}], [%r4];", "3d to 5d"),
        ("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%rd1], [sm], 64;", "immediate 128"),
    ] {
        let text = body(line);
        let m = ptx::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let errs = ptx::validate::validate_errors(&m);
        assert!(
            errs.iter().any(|d| d.to_string().contains(why)),
            "`{line}`: {errs:?}"
        );
        if ptx::ptxas::ptxas_for_tests("wrong TMA forms").is_some() {
            assert!(ptxas(&text, "sm_90a").is_err(), "ptxas took `{line}`");
        }
    }
}
