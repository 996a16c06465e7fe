//! Property tests: (b) random well-typed instruction sequences built as IR print, parse back
//! equal, validate clean and (a few, when ptxas is installed) assemble; (c) mutated corpus files
//! never make the parser panic.

use proptest::prelude::*;
use ptx::*;

const NREG: u32 = 8;

/// Register classes of the generated kernels: name prefix and type.
#[derive(Clone, Copy, Debug)]
enum Class {
    P,
    R,
    Rd,
    F,
    Fd,
}

impl Class {
    fn prefix(self) -> &'static str {
        match self {
            Class::P => "%p",
            Class::R => "%r",
            Class::Rd => "%rd",
            Class::F => "%f",
            Class::Fd => "%fd",
        }
    }
    fn ty(self) -> Ty {
        match self {
            Class::P => Ty::Pred,
            Class::R => Ty::B32,
            Class::Rd => Ty::B64,
            Class::F => Ty::F32,
            Class::Fd => Ty::F64,
        }
    }
}

fn reg(c: Class) -> impl Strategy<Value = Operand> {
    // %rd0 holds the kernel's pointer argument: never overwrite it (keeps st/ld addresses sane).
    (0..NREG).prop_map(move |i| Operand::Reg(format!("{}{i}", c.prefix())))
}
fn dst(c: Class) -> impl Strategy<Value = Operand> {
    (1..NREG).prop_map(move |i| Operand::Reg(format!("{}{i}", c.prefix())))
}

/// A source of a class: register or immediate.
fn src(c: Class) -> BoxedStrategy<Operand> {
    match c {
        Class::P => reg(c).boxed(),
        Class::R | Class::Rd => {
            prop_oneof![3 => reg(c), 1 => (-1000i64..1000).prop_map(Operand::int)].boxed()
        }
        Class::F => prop_oneof![
            3 => reg(c),
            1 => (-100.0f32..100.0).prop_map(|x| Operand::Imm(Imm::F32(x.to_bits())))
        ]
        .boxed(),
        Class::Fd => prop_oneof![
            3 => reg(c),
            1 => (-100.0f64..100.0).prop_map(|x| Operand::Imm(Imm::F64(x.to_bits())))
        ]
        .boxed(),
    }
}

fn ins(op: Opcode, mods: Vec<Mod>, args: Vec<Operand>) -> Instruction {
    Instruction::new(op, mods, args)
}

fn int_ty(c: Class, signed: bool) -> Ty {
    match (c, signed) {
        (Class::Rd, true) => Ty::S64,
        (Class::Rd, false) => Ty::U64,
        (_, true) => Ty::S32,
        (_, false) => Ty::U32,
    }
}

fn arith() -> BoxedStrategy<Instruction> {
    let int_class = prop_oneof![Just(Class::R), Just(Class::Rd)];
    let float_class = prop_oneof![Just(Class::F), Just(Class::Fd)];
    prop_oneof![
        // integer add/sub/min/max
        (int_class.clone(), any::<bool>(), 0..4usize).prop_flat_map(|(c, s, k)| {
            let op = [Opcode::Add, Opcode::Sub, Opcode::Min, Opcode::Max][k];
            (dst(c), src(c), src(c))
                .prop_map(move |(d, a, b)| ins(op, vec![Mod::Type(int_ty(c, s))], vec![d, a, b]))
        }),
        // float add/sub/mul with rounding
        (
            float_class.clone(),
            0..3usize,
            prop::option::of(prop_oneof![
                Just(Flag::Rn),
                Just(Flag::Rz),
                Just(Flag::Rm),
                Just(Flag::Rp)
            ])
        )
            .prop_flat_map(|(c, k, rnd)| {
                let op = [Opcode::Add, Opcode::Sub, Opcode::Mul][k];
                (dst(c), src(c), src(c)).prop_map(move |(d, a, b)| {
                    let mut mods: Vec<Mod> = rnd.map(Mod::Flag).into_iter().collect();
                    mods.push(Mod::Type(c.ty()));
                    ins(op, mods, vec![d, a, b])
                })
            }),
        // fma.rn
        float_class.prop_flat_map(|c| (dst(c), src(c), src(c), src(c)).prop_map(
            move |(d, a, b, e)| ins(
                Opcode::Fma,
                vec![Mod::Flag(Flag::Rn), Mod::Type(c.ty())],
                vec![d, a, b, e]
            )
        )),
        // mul.lo / mad.lo
        (int_class.clone(), any::<bool>()).prop_flat_map(|(c, s)| (dst(c), src(c), src(c), src(c))
            .prop_map(move |(d, a, b, e)| if s {
                ins(
                    Opcode::Mul,
                    vec![Mod::Flag(Flag::Lo), Mod::Type(int_ty(c, s))],
                    vec![d, a, b],
                )
            } else {
                ins(
                    Opcode::Mad,
                    vec![Mod::Flag(Flag::Lo), Mod::Type(int_ty(c, s))],
                    vec![d, a, b, e],
                )
            })),
        // mul.wide
        (any::<bool>(), dst(Class::Rd), src(Class::R), src(Class::R)).prop_map(|(s, d, a, b)| ins(
            Opcode::Mul,
            vec![Mod::Flag(Flag::Wide), Mod::Type(int_ty(Class::R, s))],
            vec![d, a, b]
        )),
        // bitwise
        (
            prop_oneof![Just(Class::R), Just(Class::Rd), Just(Class::P)],
            0..3usize
        )
            .prop_flat_map(|(c, k)| {
                let op = [Opcode::And, Opcode::Or, Opcode::Xor][k];
                let t = match c {
                    Class::P => Ty::Pred,
                    Class::Rd => Ty::B64,
                    _ => Ty::B32,
                };
                (dst(c), src(c), src(c))
                    .prop_map(move |(d, a, b)| ins(op, vec![Mod::Type(t)], vec![d, a, b]))
            }),
        (dst(Class::R), src(Class::R)).prop_map(|(d, a)| ins(
            Opcode::Not,
            vec![Mod::Type(Ty::B32)],
            vec![d, a]
        )),
        // shifts: amount is u32
        (
            int_class,
            any::<bool>(),
            prop_oneof![reg(Class::R), (0i64..64).prop_map(Operand::int)]
        )
            .prop_flat_map(|(c, left, amt)| {
                let t = if left {
                    if matches!(c, Class::Rd) {
                        Ty::B64
                    } else {
                        Ty::B32
                    }
                } else {
                    int_ty(c, true)
                };
                let op = if left { Opcode::Shl } else { Opcode::Shr };
                (dst(c), src(c))
                    .prop_map(move |(d, a)| ins(op, vec![Mod::Type(t)], vec![d, a, amt.clone()]))
            }),
        // setp / selp
        (
            prop_oneof![
                Just((Class::R, Ty::S32)),
                Just((Class::F, Ty::F32)),
                Just((Class::Rd, Ty::U64))
            ],
            prop_oneof![
                Just(Flag::Eq),
                Just(Flag::Ne),
                Just(Flag::Lt),
                Just(Flag::Le),
                Just(Flag::Gt),
                Just(Flag::Ge)
            ]
        )
            .prop_flat_map(|((c, t), cmp)| (dst(Class::P), reg(c), src(c)).prop_map(
                move |(d, a, b)| ins(
                    Opcode::Setp,
                    vec![Mod::Flag(cmp), Mod::Type(t)],
                    vec![d, a, b]
                )
            )),
        (prop_oneof![Just((Class::R, Ty::B32)), Just((Class::F, Ty::F32))]).prop_flat_map(
            |(c, t)| (dst(c), src(c), src(c), reg(Class::P)).prop_map(move |(d, a, b, p)| ins(
                Opcode::Selp,
                vec![Mod::Type(t)],
                vec![d, a, b, p]
            ))
        ),
        // mov and conversions
        (prop_oneof![
            Just((Class::R, Ty::B32)),
            Just((Class::F, Ty::F32)),
            Just((Class::Rd, Ty::U64))
        ])
        .prop_flat_map(|(c, t)| (dst(c), src(c)).prop_map(move |(d, a)| ins(
            Opcode::Mov,
            vec![Mod::Type(t)],
            vec![d, a]
        ))),
        (dst(Class::F), reg(Class::R)).prop_map(|(d, a)| ins(
            Opcode::Cvt,
            vec![Mod::Flag(Flag::Rn), Mod::Type(Ty::F32), Mod::Type(Ty::S32)],
            vec![d, a]
        )),
        (dst(Class::R), reg(Class::F)).prop_map(|(d, a)| ins(
            Opcode::Cvt,
            vec![Mod::Flag(Flag::Rzi), Mod::Type(Ty::S32), Mod::Type(Ty::F32)],
            vec![d, a]
        )),
        (dst(Class::Rd), reg(Class::R)).prop_map(|(d, a)| ins(
            Opcode::Cvt,
            vec![Mod::Type(Ty::U64), Mod::Type(Ty::U32)],
            vec![d, a]
        )),
        (dst(Class::Fd), reg(Class::F)).prop_map(|(d, a)| ins(
            Opcode::Cvt,
            vec![Mod::Type(Ty::F64), Mod::Type(Ty::F32)],
            vec![d, a]
        )),
        // unary float
        (0..4usize, dst(Class::F), reg(Class::F)).prop_map(|(k, d, a)| {
            let (op, m) = [
                (Opcode::Ex2, Flag::Approx),
                (Opcode::Rcp, Flag::Rn),
                (Opcode::Sqrt, Flag::Rn),
                (Opcode::Lg2, Flag::Approx),
            ][k];
            ins(op, vec![Mod::Flag(m), Mod::Type(Ty::F32)], vec![d, a])
        }),
        (dst(Class::R), src(Class::R), (0i64..32), (1i64..32)).prop_map(|(d, a, p, l)| {
            ins(
                Opcode::Bfe,
                vec![Mod::Type(Ty::U32)],
                vec![d, a, Operand::int(p), Operand::int(l)],
            )
        }),
        // memory through the pointer parameter
        (dst(Class::F), 0i64..64).prop_map(|(d, off)| ins(
            Opcode::Ld,
            vec![Mod::Space(Space::Global), Mod::Type(Ty::F32)],
            vec![
                d,
                Operand::Addr {
                    base: AddrBase::Reg("%rd0".into()),
                    offset: off * 4
                }
            ]
        )),
        (reg(Class::R), 0i64..64).prop_map(|(v, off)| ins(
            Opcode::St,
            vec![Mod::Space(Space::Global), Mod::Type(Ty::B32)],
            vec![
                Operand::Addr {
                    base: AddrBase::Reg("%rd0".into()),
                    offset: off * 4
                },
                v
            ]
        )),
        (reg(Class::F), reg(Class::F), reg(Class::F), reg(Class::F)).prop_map(|(a, b, c, e)| ins(
            Opcode::St,
            vec![Mod::Space(Space::Global), Mod::Vec(4), Mod::Type(Ty::F32)],
            vec![
                Operand::Addr {
                    base: AddrBase::Reg("%rd0".into()),
                    offset: 16
                },
                Operand::Vec(vec![a, b, c, e])
            ]
        )),
    ]
    .boxed()
}

fn guarded() -> impl Strategy<Value = Instruction> {
    (arith(), prop::option::of((any::<bool>(), 0..NREG))).prop_map(|(mut i, g)| {
        i.guard = g.map(|(negated, n)| Guard {
            negated,
            reg: format!("%p{n}"),
        });
        i
    })
}

fn kernel(body: Vec<Instruction>) -> Module {
    let mut stmts = Vec::new();
    for c in [Class::P, Class::R, Class::Rd, Class::F, Class::Fd] {
        stmts.push(Statement::Reg(RegDecl {
            ty: c.ty(),
            vec: None,
            align: None,
            names: vec![RegName {
                name: c.prefix().into(),
                count: Some(NREG),
            }],
            loc: Loc::default(),
        }));
    }
    stmts.push(Statement::Instr(Instruction::new(
        Opcode::Ld,
        vec![Mod::Space(Space::Param), Mod::Type(Ty::U64)],
        vec![
            Operand::reg("%rd0"),
            Operand::Addr {
                base: AddrBase::Sym("k_param_0".into()),
                offset: 0,
            },
        ],
    )));
    // Define every register before use so ptxas sees no uninitialised reads.
    for i in 0..NREG {
        stmts.push(Statement::Instr(Instruction::new(
            Opcode::Setp,
            vec![Mod::Flag(Flag::Ne), Mod::Type(Ty::U64)],
            vec![
                Operand::Reg(format!("%p{i}")),
                Operand::reg("%rd0"),
                Operand::int(i as i64),
            ],
        )));
        for (c, t, v) in [
            (Class::R, Ty::B32, Operand::int(i as i64)),
            (
                Class::F,
                Ty::F32,
                Operand::Imm(Imm::F32((i as f32).to_bits())),
            ),
            (
                Class::Fd,
                Ty::F64,
                Operand::Imm(Imm::F64((i as f64).to_bits())),
            ),
        ] {
            stmts.push(Statement::Instr(Instruction::new(
                Opcode::Mov,
                vec![Mod::Type(t)],
                vec![Operand::Reg(format!("{}{i}", c.prefix())), v],
            )));
        }
        if i > 0 {
            stmts.push(Statement::Instr(Instruction::new(
                Opcode::Mov,
                vec![Mod::Type(Ty::B64)],
                vec![Operand::Reg(format!("%rd{i}")), Operand::int(i as i64)],
            )));
        }
    }
    stmts.extend(body.into_iter().map(Statement::Instr));
    stmts.push(Statement::Instr(Instruction::new(
        Opcode::Ret,
        vec![],
        vec![],
    )));
    let f = Function {
        kind: FuncKind::Entry,
        linkage: Some(Linkage::Visible),
        name: "k".into(),
        rets: vec![],
        params: vec![Param {
            space: Space::Param,
            ty: Ty::U64,
            align: None,
            ptr: Some(PtrAttr {
                space: Some(Space::Global),
                align: Some(16),
            }),
            vec: None,
            name: "k_param_0".into(),
            array: None,
        }],
        directives: vec![PerfDirective::Reqntid(vec![128])],
        body: Some(stmts),
        loc: Loc::default(),
    };
    let mut m = Module::new(80, Target::new("sm_80"));
    m.items.push(Item::Func(f));
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_ir_round_trips_and_validates(body in prop::collection::vec(guarded(), 1..40)) {
        let m = kernel(body);
        let text = print(&m);
        let back = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &m, "{}", text);
        prop_assert_eq!(print(&back), text.clone());
        let errs: Vec<_> = validate(&m).into_iter().filter(|d| d.is_error()).collect();
        prop_assert!(errs.is_empty(), "{:#?}\n{}", errs, text);
        let errs: Vec<_> = validate(&back).into_iter().filter(|d| d.is_error()).collect();
        prop_assert!(errs.is_empty(), "{:#?}", errs);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn random_ir_assembles(body in prop::collection::vec(guarded(), 1..60)) {
        if ptx::ptxas::find_ptxas().is_none() {
            return Ok(());
        }
        let text = print(&kernel(body));
        let r = ptx::ptxas::assemble(&text, "sm_80", &ptx::ptxas::PtxasOptions { opt_level: Some(0), ..Default::default() });
        prop_assert!(r.is_ok(), "{}\n{}", r.unwrap_err(), text);
    }
}

#[test]
fn ptxas_presence_is_reported() {
    // with PTXFORGE_REQUIRE_PTXAS=1 (CI) a missing ptxas fails here: random_ir_assembles would
    // check nothing
    let _ = ptx::ptxas::ptxas_for_tests("random_ir_assembles");
}

// ---------------------------------------------------------------------------------------------
// (c) parser fuzzing over mutated corpus files
// ---------------------------------------------------------------------------------------------

fn corpus_texts() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus");
    let mut v = Vec::new();
    for t in ["sm_80", "sm_89", "sm_90a"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(t)) {
            let mut paths: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
                .collect();
            paths.sort();
            v.extend(paths.iter().filter_map(|p| std::fs::read_to_string(p).ok()));
        }
    }
    assert!(!v.is_empty(), "corpus not found");
    v
}

thread_local! {
    static CORPUS: Vec<String> = corpus_texts();
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Delete `len` chars at a relative position.
    Delete(f64, usize),
    /// Insert text at a relative position.
    Insert(f64, String),
    /// Replace one char.
    Replace(f64, char),
    /// Keep only a prefix.
    Truncate(f64),
    /// Delete a whitespace-separated token.
    DropToken(f64),
    /// Duplicate a token.
    DupToken(f64),
    /// Swap two tokens.
    SwapTokens(f64, f64),
}

fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::sample::select(vec![
            '{', '}', '[', ']', '(', ')', ';', ',', '.', '%', '@', '!', '<', '>', '+', '-', '|', ':',
            '"', '/', '*', '0', '9', 'x', 'f', 'd', '_', '$', '\n', ' ', '\t', '=', 'é', '\u{0}',
        ]),
        1 => any::<char>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = 0.0f64..1.0;
    prop_oneof![
        (pos.clone(), 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (pos.clone(), prop::collection::vec(interesting_char(), 1..8))
            .prop_map(|(p, s)| Mutation::Insert(p, s.into_iter().collect())),
        (
            pos.clone(),
            prop::sample::select(vec![
                ".reg .b32 %r<4294967295>;",
                "{",
                "}",
                "@%p1 ",
                ".v4",
                "[",
                "]",
                "0x",
                "0fFFFFFFFF",
                "-",
                "%tid",
                ".entry",
                ".func",
                "//",
                "/*",
                "\"",
                "mma.sync.aligned.m16n8k16",
                "<",
                ".version 99.99",
            ])
        )
            .prop_map(|(p, s)| Mutation::Insert(p, s.to_string())),
        (pos.clone(), interesting_char()).prop_map(|(p, c)| Mutation::Replace(p, c)),
        pos.clone().prop_map(Mutation::Truncate),
        pos.clone().prop_map(Mutation::DropToken),
        pos.clone().prop_map(Mutation::DupToken),
        (pos.clone(), pos).prop_map(|(a, b)| Mutation::SwapTokens(a, b)),
    ]
}

fn apply(text: &str, muts: &[Mutation]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let at = |p: f64, len: usize| ((p * len as f64) as usize).min(len);
    for m in muts {
        let n = chars.len();
        match m {
            Mutation::Delete(p, k) => {
                let i = at(*p, n);
                let j = (i + k).min(n);
                chars.drain(i..j);
            }
            Mutation::Insert(p, s) => {
                let i = at(*p, n);
                chars.splice(i..i, s.chars());
            }
            Mutation::Replace(p, c) => {
                if n > 0 {
                    let i = at(*p, n - 1);
                    chars[i] = *c;
                }
            }
            Mutation::Truncate(p) => chars.truncate(at(*p, n)),
            Mutation::DropToken(_) | Mutation::DupToken(_) | Mutation::SwapTokens(..) => {
                let s: String = chars.iter().collect();
                // token spans: maximal runs of non-whitespace
                let mut spans = Vec::new();
                let mut start = None;
                for (i, c) in s.char_indices() {
                    if c.is_whitespace() {
                        if let Some(st) = start.take() {
                            spans.push((st, i));
                        }
                    } else if start.is_none() {
                        start = Some(i);
                    }
                }
                if let Some(st) = start {
                    spans.push((st, s.len()));
                }
                if spans.is_empty() {
                    continue;
                }
                let pick = |p: f64| spans[at(p, spans.len() - 1)];
                let out = match m {
                    Mutation::DropToken(p) => {
                        let (a, b) = pick(*p);
                        format!("{}{}", &s[..a], &s[b..])
                    }
                    Mutation::DupToken(p) => {
                        let (a, b) = pick(*p);
                        format!("{} {}", &s[..b], &s[a..])
                    }
                    Mutation::SwapTokens(p, q) => {
                        let (x, y) = (pick(*p), pick(*q));
                        let (x, y) = if x.0 <= y.0 { (x, y) } else { (y, x) };
                        if x == y {
                            s.clone()
                        } else {
                            format!(
                                "{}{}{}{}{}",
                                &s[..x.0],
                                &s[y.0..y.1],
                                &s[x.1..y.0],
                                &s[x.0..x.1],
                                &s[y.1..]
                            )
                        }
                    }
                    _ => unreachable!(),
                };
                chars = out.chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn mutated_corpus_never_panics(file in 0usize..1000, muts in prop::collection::vec(mutation(), 1..6)) {
        let text = CORPUS.with(|c| c[file % c.len()].clone());
        let mutated = apply(&text, &muts);
        match parse(&mutated) {
            Ok(m) => {
                // Whatever parses must print and validate without panicking, and re-parse.
                let printed = print(&m);
                let _ = validate(&m);
                let again = parse(&printed);
                prop_assert!(again.is_ok(), "printed text does not re-parse: {:?}", again.err());
            }
            Err(e) => prop_assert!(e.line >= 1 && e.col >= 1, "bad error position {e:?}"),
        }
    }
}

#[test]
fn pathological_inputs_do_not_panic() {
    let deep_blocks = format!(
        ".version 8.0\n.target sm_80\n.entry k()\n{}",
        "{".repeat(100_000)
    );
    let deep_vec = format!(
        ".version 8.0\n.target sm_80\n.entry k()\n{{\nmov.b32 {};\n}}",
        "{".repeat(100_000)
    );
    let deep_not = format!(
        ".version 8.0\n.target sm_80\n.entry k()\n{{\nmov.pred %p, {}%q;\n}}",
        "!".repeat(100_000)
    );
    let huge_range = ".version 8.0\n.target sm_80\n.entry k()\n{\n.reg .b32 r<4294967295>;\nmov.b32 r1, r7;\nret;\n}\n";
    for t in [
        deep_blocks.as_str(),
        deep_vec.as_str(),
        deep_not.as_str(),
        huge_range,
        "",
        "\u{feff}",
        ".version",
        ".version 8.0\n.target",
    ] {
        if let Err(e) = parse(t) {
            assert!(e.line >= 1, "{e:?}");
        }
    }
}
