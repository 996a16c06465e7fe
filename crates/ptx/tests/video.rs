//! The video instructions' syntax and rules (`ptx::video`): operand selectors (`%r.b1`, `%r.h10`,
//! `%r.b7654`) and negations (`-%r`) parse and print back, well-formed forms validate, and each
//! rule the PTX ISA sets is reported; plus the validator's rules for `cvt.pack`, `bmsk`, `szext`.

use ptx::validate::{validate, DiagKind, Severity};
use ptx::video::{Part, VOp, VideoForm};
use ptx::{Operand, Sel, Statement};

fn module(body: &str) -> String {
    format!(
        ".version 8.7\n.target sm_90a\n.address_size 64\n.visible .entry k()\n{{\n\
         .reg .b32 %r<16>;\n.reg .f32 %f<4>;\n{body}\nret;\n}}\n"
    )
}

fn errors(body: &str) -> Vec<(DiagKind, String)> {
    let m = ptx::parse(&module(body)).unwrap_or_else(|e| panic!("{e}\n{body}"));
    validate(&m)
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| (d.kind, d.message))
        .collect()
}

fn instruction(text: &str) -> ptx::Instruction {
    match ptx::parse_statements(text).unwrap().into_iter().next() {
        Some(Statement::Instr(i)) => i,
        other => panic!("{other:?}"),
    }
}

#[test]
fn selectors_and_negations_round_trip() {
    let body = "vadd.s32.u32.s32.sat.add %r1, %r2.b0, %r3.h1, %r4;\n\
                vmad.s32.s32.u32.shr15 %r1, -%r2.h0, %r3, %r4;\n\
                vmad.s32.u32.u32.sat %r1, %r2, %r3, -%r4;\n\
                vsub.u32.u32.u32 %r1.b3, %r2, %r3, %r4;\n\
                vadd2.s32.s32.u32.sat %r1.h0, %r2.h31, %r3.h02, %r4;\n\
                vset4.u32.s32.ge.add %r1.b310, %r2.b7654, %r3.b0123, %r4;\n\
                vshr.s32.s32.u32.wrap.max %r1, %r2, %r3.b1, %r4;";
    let m = ptx::parse(&module(body)).unwrap();
    let text = ptx::print(&m);
    assert!(text.contains("-%r2.h0"), "{text}");
    assert!(text.contains("%r1.b310, %r2.b7654"), "{text}");
    assert_eq!(ptx::parse(&text).unwrap(), m);
    assert!(errors(body).is_empty(), "{:?}", errors(body));
    let i = instruction("vmad.s32.s32.u32.shr15 %r1, -%r2.h0, %r3, %r4;");
    assert_eq!(
        i.args[1],
        Operand::Neg(Box::new(Operand::Sel(
            Box::new(Operand::reg("%r2")),
            Sel::parse("h0").unwrap()
        )))
    );
}

#[test]
fn forms_read_into_typed_values() {
    let f = VideoForm::from_instruction(&instruction(
        "vsub.s32.u32.s32.sat %r1.h1, %r2.b2, %r3, %r4;",
    ))
    .unwrap();
    assert_eq!(f.op, VOp::Sub);
    assert_eq!(f.signed, [true, false, true]);
    assert_eq!(
        (f.asel, f.bsel, f.dsel),
        (Part::Byte(2), Part::Word, Some(Part::Half(1)))
    );
    let f = VideoForm::from_instruction(&instruction(
        "vmin4.u32.u32.u32 %r1.b20, %r2.b0167, %r3, %r4;",
    ))
    .unwrap();
    // lanes are listed most significant first: lane 0 takes byte 7 of {b, a}
    assert_eq!(f.alanes, [7, 6, 1, 0]);
    assert_eq!(f.blanes, [4, 5, 6, 7]);
    assert_eq!(f.mask, 0b0101);
    let f = VideoForm::from_instruction(&instruction("vavrg2.s32.s32.s32 %r1, %r2, %r3, %r4;"))
        .unwrap();
    assert_eq!(
        (&f.alanes[..2], &f.blanes[..2], f.mask),
        (&[0, 1][..], &[2, 3][..], 0b11)
    );
}

#[test]
fn malformed_video_forms_are_reported() {
    for (body, what) in [
        ("vadd.s32.s32 %r1, %r2, %r3;", "takes 3 types"),
        ("vadd.s32.s32.f32 %r1, %r2, %r3;", "takes 3 types"),
        ("vadd.s32.s32.s32 %r1, %r2.h2, %r3;", "selector"),
        ("vadd.s32.s32.s32.add %r1, %r2, %r3;", "operands"),
        ("vadd.s32.s32.s32 %r1, %r2, %r3, %r4;", "operands"),
        ("vadd.s32.s32.s32.min %r1.b0, %r2, %r3, %r4;", "merge form"),
        ("vshl.u32.u32.u32 %r1, %r2, %r3;", ".clamp and .wrap"),
        ("vshl.u32.u32.s32.wrap %r1, %r2, %r3;", "shift count"),
        ("vset.s32.u32 %r1, %r2, %r3;", "comparison"),
        ("vadd.s32.s32.s32 %r1, -%r2, %r3;", "negated"),
        ("vmad.s32.s32.s32.po %r1, -%r2, %r3, %r4;", "negated"),
        ("vmad.s32.s32.s32 %r1, -%r2, %r3, -%r4;", "not both"),
        ("vadd2.s32.s32.s32 %r1, %r2.h4, %r3, %r4;", ".hxy"),
        ("vadd4.s32.s32.s32 %r1, %r2.b321, %r3, %r4;", ".bxyzw"),
        (
            "vadd4.s32.s32.s32 %r1.b13, %r2, %r3, %r4;",
            "destination mask",
        ),
        (
            "vadd2.s32.s32.s32.sat.add %r1, %r2, %r3, %r4;",
            "cannot saturate",
        ),
        ("vadd2.s32.s32.s32.min %r1, %r2, %r3, %r4;", "only .add"),
        ("vadd.s32.s32.s32 %r1, %f1, %r3;", ".f32"),
        ("cvt.pack.u8.s32.b32 %r1, %r2, %r3, %r4;", "needs .sat"),
        ("cvt.pack.sat.u8.s32 %r1, %r2, %r3;", ".{u8,s8}.s32.b32"),
        ("cvt.rn.f32.s32 %f1, %r2, %r3, %r4;", "only `cvt.pack`"),
        ("szext.wrap.u32 %r1, %r2, %f1;", ".f32"),
        ("add.u32 %r1, %r2.b0, %r3;", "only video instructions"),
        ("add.s32 %r1, -%r2, %r3;", "only video instructions"),
    ] {
        let errs = errors(body);
        assert_eq!(errs.len(), 1, "{body}: {errs:?}");
        assert!(errs[0].1.contains(what), "{body}: {errs:?}");
    }
}

#[test]
fn new_forms_need_their_targets() {
    let i = instruction("cvt.pack.sat.s16.s32 %r1, %r2, %r3;");
    assert_eq!(ptx::requirement(&i).min_sm, 72);
    let i = instruction("bmsk.clamp.b32 %r1, %r2, %r3;");
    assert_eq!(
        (ptx::requirement(&i).min_sm, ptx::requirement(&i).min_ptx),
        (70, 76)
    );
    let i = instruction("vadd4.u32.u32.u32 %r1, %r2, %r3, %r4;");
    assert_eq!(ptx::requirement(&i).min_ptx, 30);
}
