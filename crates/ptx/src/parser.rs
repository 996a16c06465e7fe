//! PTX text -> [`Module`]. Recursive descent over `crate::lexer` tokens, accepting PTX as
//! LLVM NVPTX (Triton) and nvcc write it: ISA 7.0-9.x, sm_70..sm_90a and newer names, debug
//! directives (`.file`, `.loc`, `.section`) skipped. Every error names line, column and the
//! offending text.

use crate::ir::*;
use crate::isa::Opcode;
use crate::lexer::{Lexer, Tok, Token};
use crate::mods::Mod;
use crate::types::{Space, Ty};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// A parse error with its position and the source line it points into.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
    /// The whole source line, for display.
    pub source_line: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {} (in `{}`)",
            self.line,
            self.col,
            self.message,
            self.source_line.trim()
        )
    }
}

/// Parses a PTX module.
pub fn parse(text: &str) -> Result<Module, ParseError> {
    let mut p = Parser {
        text,
        lex: Lexer::new(text),
        peeked: None,
        f64_ctx: false,
        depth: 0,
    };
    p.module()
}

/// Parses a sequence of function-body statements (used by the builder's raw-PTX escape).
pub fn parse_statements(text: &str) -> Result<Vec<Statement>, ParseError> {
    let mut p = Parser {
        text,
        lex: Lexer::new(text),
        peeked: None,
        f64_ctx: false,
        depth: 0,
    };
    let mut out = Vec::new();
    loop {
        if let Tok::Eof = p.peek()?.tok {
            return Ok(out);
        }
        if let Some(s) = p.statement()? {
            out.push(s);
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    lex: Lexer<'a>,
    peeked: Option<Token<'a>>,
    /// Decimal float literals in the current instruction are f64 (else f32).
    f64_ctx: bool,
    /// Nesting depth of blocks / braces / `!` operands (bounded so bad input cannot overflow
    /// the stack).
    depth: u32,
}

/// The deepest nesting of `{ }` blocks, vector braces or initialisers the parser accepts.
const MAX_DEPTH: u32 = 256;

type PResult<T> = Result<T, ParseError>;

impl<'a> Parser<'a> {
    fn err_at(&self, line: u32, col: u32, msg: impl Into<String>) -> ParseError {
        ParseError {
            line,
            col,
            message: msg.into(),
            source_line: Lexer::line_text(self.text, line).to_string(),
        }
    }
    fn err(&self, t: &Token, msg: impl Into<String>) -> ParseError {
        self.err_at(t.line, t.col, msg)
    }
    fn peek(&mut self) -> PResult<Token<'a>> {
        if let Some(t) = self.peeked {
            return Ok(t);
        }
        let t = self.lex.next().map_err(|(l, c, m)| self.err_at(l, c, m))?;
        self.peeked = Some(t);
        Ok(t)
    }
    fn next(&mut self) -> PResult<Token<'a>> {
        let t = self.peek()?;
        self.peeked = None;
        Ok(t)
    }
    fn is_punct(&mut self, c: u8) -> PResult<bool> {
        Ok(self.peek()?.tok == Tok::Punct(c))
    }
    fn eat_punct(&mut self, c: u8) -> PResult<bool> {
        if self.is_punct(c)? {
            self.next()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }
    fn expect_punct(&mut self, c: u8) -> PResult<()> {
        let t = self.next()?;
        if t.tok == Tok::Punct(c) {
            Ok(())
        } else {
            Err(self.err(
                &t,
                format!("expected `{}`, found {}", c as char, describe(&t.tok)),
            ))
        }
    }
    fn ident(&mut self) -> PResult<&'a str> {
        let t = self.next()?;
        match t.tok {
            Tok::Ident(s) => Ok(s),
            _ => Err(self.err(&t, format!("expected a name, found {}", describe(&t.tok)))),
        }
    }
    fn int(&mut self) -> PResult<u64> {
        let t = self.next()?;
        match t.tok {
            Tok::Num(s) => parse_uint(s).ok_or_else(|| self.err(&t, format!("bad integer `{s}`"))),
            _ => Err(self.err(
                &t,
                format!("expected an integer, found {}", describe(&t.tok)),
            )),
        }
    }
    /// An integer that must fit in `u32` (register counts, alignments, directive values):
    /// larger values are an error naming `what`, never truncated.
    fn int_u32(&mut self, what: &str) -> PResult<u32> {
        let t = self.peek()?;
        let v = self.int()?;
        u32::try_from(v).map_err(|_| {
            self.err(
                &t,
                format!("{what} {v} does not fit in 32 bits (at most {})", u32::MAX),
            )
        })
    }
    /// An `.align` value: a power of two that fits in 32 bits.
    fn align(&mut self) -> PResult<u32> {
        let t = self.peek()?;
        let a = self.int_u32(".align")?;
        if !a.is_power_of_two() {
            return Err(self.err(&t, format!(".align {a} is not a power of two")));
        }
        Ok(a)
    }
    /// Skips `.loc`/`.file` lines and `.section` blocks.
    fn skip_debug(&mut self) -> PResult<bool> {
        let t = self.peek()?;
        match t.tok {
            Tok::Dot("loc") | Tok::Dot("file") => {
                // The lexer is positioned right after this token: drop the rest of its line.
                self.peeked = None;
                self.lex.skip_line();
                Ok(true)
            }
            Tok::Dot("section") => {
                self.next()?;
                // name, then a `{ ... }` block of data
                loop {
                    let t = self.next()?;
                    match t.tok {
                        Tok::Punct(b'{') => break,
                        Tok::Eof => return Err(self.err(&t, "unterminated .section")),
                        _ => {}
                    }
                }
                let mut depth = 1;
                while depth > 0 {
                    let t = self.next()?;
                    match t.tok {
                        Tok::Punct(b'{') => depth += 1,
                        Tok::Punct(b'}') => depth -= 1,
                        Tok::Eof => return Err(self.err(&t, "unterminated .section")),
                        _ => {}
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn module(&mut self) -> PResult<Module> {
        let mut m = Module {
            version: 0,
            target: Target::new(""),
            address_size: 64,
            items: Vec::new(),
        };
        let mut seen_version = false;
        loop {
            if self.skip_debug()? {
                continue;
            }
            let t = self.next()?;
            match t.tok {
                Tok::Eof => break,
                Tok::Dot("version") => {
                    let v = self.next()?;
                    m.version = match v.tok {
                        Tok::Num(s) => parse_version(s)
                            .ok_or_else(|| self.err(&v, format!("bad version `{s}`")))?,
                        _ => return Err(self.err(&v, "expected a version number")),
                    };
                    seen_version = true;
                }
                Tok::Dot("target") => {
                    m.target.arch = self.ident()?.to_string();
                    while self.eat_punct(b',')? {
                        m.target.options.push(self.ident()?.to_string());
                    }
                }
                Tok::Dot("address_size") => m.address_size = self.int_u32(".address_size")?,
                Tok::Dot("pragma") => {
                    self.strings()?;
                }
                Tok::Dot("alias") => {
                    let name = self.ident()?.to_string();
                    self.expect_punct(b',')?;
                    let target = self.ident()?.to_string();
                    self.expect_punct(b';')?;
                    m.items.push(Item::Alias { name, target });
                }
                Tok::Dot(_) => {
                    self.peeked = Some(t);
                    let item = self.module_item()?;
                    m.items.push(item);
                }
                _ => {
                    return Err(self.err(
                        &t,
                        format!("unexpected {} at module scope", describe(&t.tok)),
                    ))
                }
            }
        }
        if !seen_version {
            return Err(self.err_at(1, 1, "missing `.version` directive"));
        }
        if m.target.arch.is_empty() {
            return Err(self.err_at(1, 1, "missing `.target` directive"));
        }
        Ok(m)
    }

    fn strings(&mut self) -> PResult<Vec<String>> {
        let mut v = Vec::new();
        loop {
            let t = self.next()?;
            match t.tok {
                Tok::Str(s) => v.push(s.to_string()),
                _ => return Err(self.err(&t, "expected a string")),
            }
            if !self.eat_punct(b',')? {
                break;
            }
        }
        self.expect_punct(b';')?;
        Ok(v)
    }

    fn linkage(&mut self) -> PResult<Option<Linkage>> {
        let l = match self.peek()?.tok {
            Tok::Dot("visible") => Linkage::Visible,
            Tok::Dot("extern") => Linkage::Extern,
            Tok::Dot("weak") => Linkage::Weak,
            Tok::Dot("common") => Linkage::Common,
            _ => return Ok(None),
        };
        self.next()?;
        Ok(Some(l))
    }

    fn module_item(&mut self) -> PResult<Item> {
        let linkage = self.linkage()?;
        let t = self.peek()?;
        match t.tok {
            Tok::Dot("entry") | Tok::Dot("func") => Ok(Item::Func(self.function(linkage)?)),
            Tok::Dot(s) if Space::from_str(s).is_some() => Ok(Item::Var(self.var_decl(linkage)?)),
            _ => Err(self.err(
                &t,
                format!("unexpected {} at module scope", describe(&t.tok)),
            )),
        }
    }

    fn var_decl(&mut self, linkage: Option<Linkage>) -> PResult<VarDecl> {
        let t = self.next()?;
        let space = match t.tok {
            Tok::Dot(s) => Space::from_str(s)
                .ok_or_else(|| self.err(&t, format!("unknown state space `.{s}`")))?,
            _ => return Err(self.err(&t, "expected a state space")),
        };
        let (mut align, mut vec, mut ty) = (None, None, None);
        loop {
            let t = self.peek()?;
            match t.tok {
                Tok::Dot("align") => {
                    self.next()?;
                    align = Some(self.align()?);
                }
                Tok::Dot("ptr") => {
                    self.next()?;
                }
                Tok::Dot(s) if matches!(Mod::parse(s), Some(Mod::Vec(_))) => {
                    self.next()?;
                    if let Some(Mod::Vec(n)) = Mod::parse(s) {
                        vec = Some(n);
                    }
                }
                Tok::Dot(s) if Ty::from_str(s).is_some() && ty.is_none() => {
                    self.next()?;
                    ty = Ty::from_str(s);
                }
                _ => break,
            }
        }
        let ty = ty.ok_or_else(|| self.err(&t, "variable declaration without a type"))?;
        let name = self.ident()?.to_string();
        let mut dims = Vec::new();
        while self.eat_punct(b'[')? {
            if self.eat_punct(b']')? {
                dims.push(None);
            } else {
                dims.push(Some(self.int()?));
                self.expect_punct(b']')?;
            }
        }
        self.f64_ctx = ty == Ty::F64;
        let init = if self.eat_punct(b'=')? {
            Some(self.init_list()?)
        } else {
            None
        };
        self.expect_punct(b';')?;
        Ok(VarDecl {
            linkage,
            space,
            align,
            vec,
            ty,
            name,
            dims,
            init,
            loc: Loc::at(t.line, t.col),
        })
    }

    fn init_list(&mut self) -> PResult<Vec<Init>> {
        let mut out = Vec::new();
        self.init_into(&mut out)?;
        Ok(out)
    }
    fn init_into(&mut self, out: &mut Vec<Init>) -> PResult<()> {
        self.enter()?;
        let r = self.init_into_inner(out);
        self.depth -= 1;
        r
    }
    fn init_into_inner(&mut self, out: &mut Vec<Init>) -> PResult<()> {
        if self.eat_punct(b'{')? {
            if self.eat_punct(b'}')? {
                return Ok(());
            }
            loop {
                self.init_into(out)?;
                if !self.eat_punct(b',')? {
                    break;
                }
            }
            return self.expect_punct(b'}');
        }
        let neg = self.eat_punct(b'-')?;
        let t = self.next()?;
        match t.tok {
            Tok::Num(s) => {
                let v = parse_num(s, self.f64_ctx)
                    .ok_or_else(|| self.err(&t, format!("bad number `{s}`")))?;
                out.push(match v {
                    Imm::Int(i) => Init::Int(if neg { -(i as i128) } else { i as i128 }),
                    Imm::U64(u) => Init::Int(if neg { -(u as i128) } else { u as i128 }),
                    Imm::F32(b) => Init::F32(if neg { b ^ 0x8000_0000 } else { b }),
                    Imm::F64(b) => Init::F64(if neg { b ^ (1 << 63) } else { b }),
                });
            }
            Tok::Ident("generic") => {
                self.expect_punct(b'(')?;
                let name = self.ident()?.to_string();
                self.expect_punct(b')')?;
                let offset = self.sym_offset()?;
                out.push(Init::Sym {
                    name,
                    generic: true,
                    offset,
                });
            }
            Tok::Ident(name) if self.is_punct(b'=')? => {
                // `field = value` of a .texref/.samplerref initialiser
                self.next()?;
                let mut v = Vec::new();
                self.init_into(&mut v)?;
                let value = match (v.pop(), v.is_empty()) {
                    (Some(x), true) => Box::new(x),
                    _ => return Err(self.err(&t, format!("bad value for field `{name}`"))),
                };
                out.push(Init::Field {
                    name: name.to_string(),
                    value,
                });
            }
            Tok::Ident(name) => {
                let offset = self.sym_offset()?;
                out.push(Init::Sym {
                    name: name.to_string(),
                    generic: false,
                    offset,
                });
            }
            _ => return Err(self.err(&t, format!("bad initialiser {}", describe(&t.tok)))),
        }
        Ok(())
    }
    fn sym_offset(&mut self) -> PResult<i64> {
        if self.is_punct(b'+')? {
            self.next()?;
            let neg = self.eat_punct(b'-')?;
            let v = self.int()? as i64;
            return Ok(if neg { -v } else { v });
        }
        Ok(0)
    }

    fn function(&mut self, linkage: Option<Linkage>) -> PResult<Function> {
        let t = self.next()?;
        let kind = if t.tok == Tok::Dot("entry") {
            FuncKind::Entry
        } else {
            FuncKind::Func
        };
        let mut rets = Vec::new();
        if kind == FuncKind::Func && self.is_punct(b'(')? {
            rets = self.param_list()?;
        }
        let name = self.ident()?.to_string();
        let params = if self.is_punct(b'(')? {
            self.param_list()?
        } else {
            Vec::new()
        };
        let mut directives = Vec::new();
        loop {
            let d = self.peek()?;
            let dir = match d.tok {
                Tok::Dot("maxntid") => {
                    self.next()?;
                    PerfDirective::Maxntid(self.int_list()?)
                }
                Tok::Dot("reqntid") => {
                    self.next()?;
                    PerfDirective::Reqntid(self.int_list()?)
                }
                Tok::Dot("reqnctapercluster") => {
                    self.next()?;
                    PerfDirective::Reqnctapercluster(self.int_list()?)
                }
                Tok::Dot("minnctapersm") => {
                    self.next()?;
                    PerfDirective::Minnctapersm(self.int_u32(".minnctapersm")?)
                }
                Tok::Dot("maxnctapersm") => {
                    self.next()?;
                    PerfDirective::Maxnctapersm(self.int_u32(".maxnctapersm")?)
                }
                Tok::Dot("maxnreg") => {
                    self.next()?;
                    PerfDirective::Maxnreg(self.int_u32(".maxnreg")?)
                }
                Tok::Dot("maxclusterrank") => {
                    self.next()?;
                    PerfDirective::Maxclusterrank(self.int_u32(".maxclusterrank")?)
                }
                Tok::Dot("explicitcluster") => {
                    self.next()?;
                    PerfDirective::ExplicitCluster
                }
                Tok::Dot("noreturn") => {
                    self.next()?;
                    PerfDirective::Noreturn
                }
                Tok::Dot("pragma") => {
                    self.next()?;
                    let mut v = Vec::new();
                    loop {
                        let s = self.next()?;
                        match s.tok {
                            Tok::Str(x) => v.push(x.to_string()),
                            _ => return Err(self.err(&s, "expected a string after .pragma")),
                        }
                        if !self.eat_punct(b',')? {
                            break;
                        }
                    }
                    self.eat_punct(b';')?;
                    PerfDirective::Pragma(v)
                }
                _ => break,
            };
            directives.push(dir);
        }
        let body = if self.eat_punct(b';')? {
            None
        } else {
            let open = self.next()?;
            if open.tok != Tok::Punct(b'{') {
                return Err(self.err(
                    &open,
                    format!("expected function body `{{`, found {}", describe(&open.tok)),
                ));
            }
            let mut b = self.block_body()?;
            resolve_plain_regs(&mut b);
            Some(b)
        };
        Ok(Function {
            kind,
            linkage,
            name,
            rets,
            params,
            directives,
            body,
            loc: Loc::at(t.line, t.col),
        })
    }

    fn int_list(&mut self) -> PResult<Vec<u32>> {
        let mut v = vec![self.int_u32("dimension")?];
        while self.eat_punct(b',')? {
            v.push(self.int_u32("dimension")?);
        }
        Ok(v)
    }

    fn param_list(&mut self) -> PResult<Vec<Param>> {
        self.expect_punct(b'(')?;
        let mut v = Vec::new();
        if self.eat_punct(b')')? {
            return Ok(v);
        }
        loop {
            v.push(self.param()?);
            if !self.eat_punct(b',')? {
                break;
            }
        }
        self.expect_punct(b')')?;
        Ok(v)
    }

    fn param(&mut self) -> PResult<Param> {
        let t = self.next()?;
        let space = match t.tok {
            Tok::Dot("param") => Space::Param,
            Tok::Dot("reg") => Space::Reg,
            _ => {
                return Err(self.err(
                    &t,
                    format!("expected `.param` or `.reg`, found {}", describe(&t.tok)),
                ))
            }
        };
        let (mut align, mut ty, mut ptr): (Option<u32>, Option<Ty>, Option<PtrAttr>) =
            (None, None, None);
        let mut vec = None;
        loop {
            let d = self.peek()?;
            match d.tok {
                Tok::Dot(s) if vec.is_none() && matches!(Mod::parse(s), Some(Mod::Vec(_))) => {
                    self.next()?;
                    if let Some(Mod::Vec(n)) = Mod::parse(s) {
                        vec = Some(n);
                    }
                }
                Tok::Dot("align") => {
                    self.next()?;
                    let a = self.align()?;
                    match &mut ptr {
                        Some(p) => p.align = Some(a),
                        None => align = Some(a),
                    }
                }
                Tok::Dot("ptr") => {
                    self.next()?;
                    ptr = Some(PtrAttr {
                        space: None,
                        align: None,
                    });
                }
                Tok::Dot(s) if ptr.is_some() && Space::from_str(s).is_some() => {
                    self.next()?;
                    if let Some(p) = &mut ptr {
                        p.space = Space::from_str(s);
                    }
                }
                Tok::Dot(s) if Ty::from_str(s).is_some() && ty.is_none() => {
                    self.next()?;
                    ty = Ty::from_str(s);
                }
                _ => break,
            }
        }
        let ty = ty.ok_or_else(|| self.err(&t, "parameter without a type"))?;
        let name = self.ident()?.to_string();
        let array = if self.eat_punct(b'[')? {
            let n = self.int()?;
            self.expect_punct(b']')?;
            Some(n)
        } else {
            None
        };
        Ok(Param {
            space,
            ty,
            align,
            ptr,
            vec,
            name,
            array,
        })
    }

    /// Statements up to and including the closing `}`.
    fn block_body(&mut self) -> PResult<Vec<Statement>> {
        let mut out = Vec::new();
        loop {
            let t = self.peek()?;
            match t.tok {
                Tok::Punct(b'}') => {
                    self.next()?;
                    return Ok(out);
                }
                Tok::Eof => return Err(self.err(&t, "unexpected end of file: missing `}`")),
                _ => {
                    if let Some(s) = self.statement()? {
                        out.push(s);
                    }
                }
            }
        }
    }

    fn statement(&mut self) -> PResult<Option<Statement>> {
        if self.skip_debug()? {
            return Ok(None);
        }
        let t = self.peek()?;
        match t.tok {
            Tok::Punct(b'{') => {
                self.next()?;
                self.enter()?;
                let b = self.block_body();
                self.depth -= 1;
                Ok(Some(Statement::Block(b?)))
            }
            Tok::Punct(b';') => {
                self.next()?;
                Ok(None)
            }
            Tok::Dot("reg") => {
                self.next()?;
                Ok(Some(Statement::Reg(self.reg_decl(&t)?)))
            }
            Tok::Dot("pragma") => {
                self.next()?;
                Ok(Some(Statement::Pragma(self.strings()?)))
            }
            Tok::Dot(s) if Space::from_str(s).is_some() => {
                Ok(Some(Statement::Var(self.var_decl(None)?)))
            }
            Tok::Dot(_) => {
                let l = self.linkage()?;
                if l.is_some() {
                    return Ok(Some(Statement::Var(self.var_decl(l)?)));
                }
                Err(self.err(
                    &t,
                    format!("unknown directive {} in function body", describe(&t.tok)),
                ))
            }
            Tok::Punct(b'@') => {
                self.next()?;
                let negated = self.eat_punct(b'!')?;
                let reg = self.ident()?.to_string();
                let mut ins = self.instruction()?;
                ins.guard = Some(Guard { negated, reg });
                ins.loc = Loc::at(t.line, t.col);
                Ok(Some(Statement::Instr(ins)))
            }
            Tok::Ident(name) => {
                self.next()?;
                if self.is_punct(b':')? {
                    self.next()?;
                    let d = self.peek()?;
                    match d.tok {
                        Tok::Dot("branchtargets") => {
                            self.next()?;
                            let mut targets = vec![self.ident()?.to_string()];
                            while self.eat_punct(b',')? {
                                targets.push(self.ident()?.to_string());
                            }
                            self.expect_punct(b';')?;
                            return Ok(Some(Statement::BranchTargets {
                                label: name.to_string(),
                                targets,
                            }));
                        }
                        Tok::Dot("calltargets") => {
                            self.next()?;
                            let mut targets = vec![self.ident()?.to_string()];
                            while self.eat_punct(b',')? {
                                targets.push(self.ident()?.to_string());
                            }
                            self.expect_punct(b';')?;
                            return Ok(Some(Statement::CallTargets {
                                label: name.to_string(),
                                targets,
                            }));
                        }
                        Tok::Dot("callprototype") => {
                            self.next()?;
                            let rets = if self.is_punct(b'(')? {
                                self.param_list()?
                            } else {
                                Vec::new()
                            };
                            let u = self.ident()?;
                            if u != "_" {
                                return Err(self.err(&d, "expected `_` in .callprototype"));
                            }
                            let params = if self.is_punct(b'(')? {
                                self.param_list()?
                            } else {
                                Vec::new()
                            };
                            let noreturn = if self.peek()?.tok == Tok::Dot("noreturn") {
                                self.next()?;
                                true
                            } else {
                                false
                            };
                            self.expect_punct(b';')?;
                            return Ok(Some(Statement::CallPrototype {
                                label: name.to_string(),
                                rets,
                                params,
                                noreturn,
                            }));
                        }
                        _ => {
                            return Ok(Some(Statement::Label(
                                name.to_string(),
                                Loc::at(t.line, t.col),
                            )))
                        }
                    }
                }
                let mut ins = self.instruction_from(t)?;
                ins.loc = Loc::at(t.line, t.col);
                Ok(Some(Statement::Instr(ins)))
            }
            _ => Err(self.err(
                &t,
                format!("unexpected {} in function body", describe(&t.tok)),
            )),
        }
    }

    fn reg_decl(&mut self, start: &Token) -> PResult<RegDecl> {
        let (mut ty, mut vec, mut align) = (None, None, None);
        loop {
            let d = self.peek()?;
            match d.tok {
                Tok::Dot("align") => {
                    self.next()?;
                    align = Some(self.align()?);
                }
                Tok::Dot(s) if matches!(Mod::parse(s), Some(Mod::Vec(_))) => {
                    self.next()?;
                    if let Some(Mod::Vec(n)) = Mod::parse(s) {
                        vec = Some(n);
                    }
                }
                Tok::Dot(s) if Ty::from_str(s).is_some() => {
                    self.next()?;
                    ty = Ty::from_str(s);
                }
                Tok::Dot(s) => return Err(self.err(&d, format!("unknown register type `.{s}`"))),
                _ => break,
            }
        }
        let ty = ty.ok_or_else(|| self.err(start, "register declaration without a type"))?;
        let mut names = Vec::new();
        loop {
            let name = self.ident()?.to_string();
            let count = if self.eat_punct(b'<')? {
                let n = self.int_u32("register count")?;
                self.expect_punct(b'>')?;
                Some(n)
            } else {
                None
            };
            names.push(RegName { name, count });
            if !self.eat_punct(b',')? {
                break;
            }
        }
        self.expect_punct(b';')?;
        Ok(RegDecl {
            ty,
            vec,
            align,
            names,
            loc: Loc::at(start.line, start.col),
        })
    }

    fn instruction(&mut self) -> PResult<Instruction> {
        let t = self.next()?;
        self.instruction_from(t)
    }

    /// An instruction whose first token (the opcode's first part) was already read.
    fn instruction_from(&mut self, t: Token<'a>) -> PResult<Instruction> {
        let Tok::Ident(first) = t.tok else {
            return Err(self.err(
                &t,
                format!("expected an instruction, found {}", describe(&t.tok)),
            ));
        };
        // Dotted parts on the stack (no allocation per instruction).
        const MAX_MODS: usize = 24;
        let mut buf: [(&'a str, Token<'a>); MAX_MODS] = [(first, t); MAX_MODS];
        let mut np = 1;
        loop {
            let d = self.peek()?;
            match d.tok {
                Tok::Dot(s) if !d.spaced => {
                    if np == MAX_MODS {
                        return Err(self.err(&d, format!("more than {} modifiers", MAX_MODS - 1)));
                    }
                    self.next()?;
                    buf[np] = (s, d);
                    np += 1;
                }
                _ => break,
            }
        }
        let parts = &buf[..np];
        // Longest dotted prefix that names an opcode. Unspaced parts are contiguous in the
        // source, so each candidate name is a slice of it (no allocation).
        let base = self.text.as_ptr() as usize;
        let start = first.as_ptr() as usize - base;
        let mut op = None;
        for k in (1..=parts.len().min(Opcode::MAX_PARTS)).rev() {
            let last = parts[k - 1].0;
            let end = last.as_ptr() as usize - base + last.len();
            if let Some(o) = self.text.get(start..end).and_then(Opcode::from_name) {
                op = Some((o, k));
                break;
            }
        }
        let Some((op, k)) = op else {
            let full: Vec<&str> = parts.iter().map(|p| p.0).collect();
            return Err(self.err(&t, format!("unsupported instruction `{}`", full.join("."))));
        };
        let mut mods = Vec::with_capacity(parts.len() - k);
        for (s, tok) in &parts[k..] {
            match Mod::parse(s) {
                Some(m) => mods.push(m),
                None => {
                    return Err(self.err(tok, format!("unknown modifier `.{s}` on `{}`", op.name())))
                }
            }
        }
        // Decimal float literals take the width of the instruction's type.
        self.f64_ctx = mods.contains(&Mod::Type(Ty::F64));
        let mut args = Vec::new();
        if !self.is_punct(b';')? {
            loop {
                args.push(self.operand()?);
                // `ld [a].unified`: kept as the `.unified` modifier (the printer puts it back)
                if matches!(args.last(), Some(Operand::Addr { .. }))
                    && self.peek()?.tok == Tok::Dot("unified")
                {
                    self.next()?;
                    mods.push(Mod::Flag(crate::mods::Flag::Unified));
                }
                if !self.eat_punct(b',')? {
                    break;
                }
            }
        }
        let end = self.next()?;
        if end.tok != Tok::Punct(b';') {
            return Err(self.err(
                &end,
                format!(
                    "expected `;` after `{}` operands, found {}",
                    op.name(),
                    describe(&end.tok)
                ),
            ));
        }
        Ok(Instruction {
            guard: None,
            op,
            mods,
            args,
            loc: Loc::at(t.line, t.col),
        })
    }

    fn operand(&mut self) -> PResult<Operand> {
        let first = self.operand1()?;
        if self.eat_punct(b'|')? {
            let second = self.operand1()?;
            return Ok(Operand::Pair(Box::new(first), Box::new(second)));
        }
        Ok(first)
    }

    fn operand1(&mut self) -> PResult<Operand> {
        self.enter()?;
        let r = self.operand1_inner();
        self.depth -= 1;
        r
    }

    /// Counts one level of nesting; errors past [`MAX_DEPTH`].
    fn enter(&mut self) -> PResult<()> {
        if self.depth >= MAX_DEPTH {
            let t = self.peek()?;
            return Err(self.err(&t, format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        Ok(())
    }

    /// `reg` followed by an unspaced video selector (`.b0`, `.h10`, `.b3210`), if any.
    fn selected(&mut self, reg: Operand) -> PResult<Operand> {
        let d = self.peek()?;
        if let Tok::Dot(c) = d.tok {
            if !d.spaced {
                if let Some(sel) = Sel::parse(c) {
                    self.next()?;
                    return Ok(Operand::Sel(Box::new(reg), sel));
                }
            }
        }
        Ok(reg)
    }

    fn operand1_inner(&mut self) -> PResult<Operand> {
        let t = self.next()?;
        match t.tok {
            Tok::Punct(b'{') => Ok(Operand::Vec(self.operand_list(b'}')?)),
            Tok::Punct(b'(') => Ok(Operand::List(self.operand_list(b')')?)),
            Tok::Punct(b'[') => self.address(),
            Tok::Punct(b'!') => Ok(Operand::Not(Box::new(self.operand1()?))),
            Tok::Punct(b'-') => self.negated(),
            Tok::Num(s) => Ok(Operand::Imm(
                parse_num(s, self.f64_ctx)
                    .ok_or_else(|| self.err(&t, format!("bad number `{s}`")))?,
            )),
            Tok::Ident("_") => Ok(Operand::Sink),
            Tok::Ident(s) if s.starts_with('%') => self.register(s),
            Tok::Ident("WARP_SZ") => Ok(Operand::SReg(SReg::WarpSz)),
            Tok::Ident(s) => {
                let name = self.component(s)?;
                let offset = self.sym_offset()?;
                Ok(Operand::Sym { name, offset })
            }
            _ => Err(self.err(
                &t,
                format!("expected an operand, found {}", describe(&t.tok)),
            )),
        }
    }

    /// Comma-separated operands up to `close` (the opening bracket already read).
    fn operand_list(&mut self, close: u8) -> PResult<Vec<Operand>> {
        let mut v = Vec::new();
        if !self.eat_punct(close)? {
            loop {
                v.push(self.operand1()?);
                if !self.eat_punct(b',')? {
                    break;
                }
            }
            self.expect_punct(close)?;
        }
        Ok(v)
    }

    /// `[base+imm-imm...]`, `[tensorMap, {coords}]` or `[tex, sampler, {coords}]` (the `[`
    /// already read).
    fn address(&mut self) -> PResult<Operand> {
        let b = self.next()?;
        let base = match b.tok {
            Tok::Ident(s) if s.starts_with('%') => AddrBase::Reg(s.to_string()),
            Tok::Ident(s) => AddrBase::Sym(s.to_string()),
            Tok::Num(s) => AddrBase::Imm(
                parse_uint(s).ok_or_else(|| self.err(&b, format!("bad address `{s}`")))?,
            ),
            _ => return Err(self.err(&b, format!("bad address {}", describe(&b.tok)))),
        };
        let mut offset = 0i64;
        loop {
            if self.eat_punct(b'+')? {
                let neg = self.eat_punct(b'-')?;
                let v = self.int()? as i64;
                offset = offset.wrapping_add(if neg { -v } else { v });
            } else if self.eat_punct(b'-')? {
                offset = offset.wrapping_sub(self.int()? as i64);
            } else {
                break;
            }
        }
        if offset == 0 && self.eat_punct(b',')? {
            return self.coordinate_address(base, &b);
        }
        self.expect_punct(b']')?;
        Ok(Operand::Addr { base, offset })
    }

    /// `[tensorMap, {c0, c1}]`: tensor coordinates of a bulk tensor copy or a texture fetch;
    /// `[tex, sampler, {c0, c1}]`: an independent-mode fetch (`base` and its `,` read).
    fn coordinate_address(&mut self, base: AddrBase, at: &Token) -> PResult<Operand> {
        let coords = |o: Operand| match o {
            Operand::Vec(v) => v,
            other => vec![other],
        };
        let first = self.operand1()?;
        if self.eat_punct(b',')? {
            let sampler = match first {
                Operand::Reg(r) => AddrBase::Reg(r),
                Operand::Sym { name, offset: 0 } => AddrBase::Sym(name),
                _ => return Err(self.err(at, "bad sampler in `[tex, sampler, {..}]`")),
            };
            let coords = coords(self.operand1()?);
            self.expect_punct(b']')?;
            return Ok(Operand::SampledAddr {
                base,
                sampler,
                coords,
            });
        }
        self.expect_punct(b']')?;
        Ok(Operand::TensorAddr {
            base,
            coords: coords(first),
        })
    }

    /// A negative number, or `-%r` (vmad's negated operands) with an optional selector.
    fn negated(&mut self) -> PResult<Operand> {
        let n = self.next()?;
        match n.tok {
            Tok::Num(s) => {
                let v = parse_num(s, self.f64_ctx)
                    .ok_or_else(|| self.err(&n, format!("bad number `{s}`")))?;
                Ok(Operand::Imm(match v {
                    Imm::Int(i) => Imm::Int(i.wrapping_neg()),
                    Imm::U64(u) => Imm::Int((u as i64).wrapping_neg()),
                    Imm::F32(b) => Imm::F32(b ^ 0x8000_0000),
                    Imm::F64(b) => Imm::F64(b ^ (1 << 63)),
                }))
            }
            Tok::Ident(s) if s.starts_with('%') => Ok(Operand::Neg(Box::new(
                self.selected(Operand::Reg(s.to_string()))?,
            ))),
            _ => Err(self.err(&n, "expected a number or register after `-`")),
        }
    }

    /// `%name`: a special register (`%tid.x` takes its component), or a register with an
    /// optional vector component and selector.
    fn register(&mut self, s: &str) -> PResult<Operand> {
        if SReg::needs_dim(s) {
            let d = self.next()?;
            if let Tok::Dot(c) = d.tok {
                if let Some(r) = SReg::parse(&format!("{s}.{c}")) {
                    return Ok(Operand::SReg(r));
                }
            }
            return Err(self.err(&d, format!("`{s}` needs a component .x, .y or .z")));
        }
        if let Some(r) = SReg::parse(s) {
            return Ok(Operand::SReg(r));
        }
        let name = self.component(s)?;
        self.selected(Operand::Reg(name))
    }
}

impl Parser<'_> {
    /// A register name with its vector component when one follows without space (`%v.x`,
    /// `%v.a`): kept in the name, see [`split_component`].
    fn component(&mut self, name: &str) -> PResult<String> {
        let d = self.peek()?;
        if let Tok::Dot(c) = d.tok {
            let full = format!("{name}.{c}");
            if !d.spaced && split_component(&full).is_some() {
                self.next()?;
                return Ok(full);
            }
        }
        Ok(name.to_string())
    }
}

/// Registers declared without a `%` prefix are parsed as symbols, and registers named like a
/// special register or predefined identifier (`.reg .pred %pm<4>;`, which ptxas accepts and
/// which then shadows `%pm0`) as that; turn them into registers.
fn resolve_plain_regs(body: &mut [Statement]) {
    let mut plain = PlainRegs::default();
    fn collect(b: &[Statement], set: &mut PlainRegs) {
        for s in b {
            match s {
                Statement::Reg(d) => {
                    for n in &d.names {
                        let first = match n.count {
                            Some(_) => format!("{}0", n.name),
                            None => n.name.clone(),
                        };
                        if !n.name.starts_with('%') || SReg::parse(&first).is_some() {
                            match n.count {
                                None => {
                                    set.exact.insert(n.name.clone());
                                }
                                Some(c) => {
                                    // Kept as a range: `r<4294967295>` must not be expanded.
                                    let e = set.ranges.entry(n.name.clone()).or_insert(0);
                                    *e = (*e).max(c);
                                }
                            }
                        }
                    }
                }
                Statement::Block(b) => collect(b, set),
                _ => {}
            }
        }
    }
    collect(body, &mut plain);
    if plain.exact.is_empty() && plain.ranges.is_empty() {
        return;
    }
    fn fix(o: &mut Operand, set: &PlainRegs) {
        match o {
            Operand::Sym { name, offset: 0 } if set.contains(name.as_str()) => {
                *o = Operand::Reg(std::mem::take(name))
            }
            Operand::SReg(r) if set.contains(&r.name()) => *o = Operand::Reg(r.name()),
            Operand::Addr { base, .. } => {
                if let AddrBase::Sym(n) = base {
                    if set.contains(n.as_str()) {
                        *base = AddrBase::Reg(std::mem::take(n));
                    }
                }
            }
            Operand::Not(x) | Operand::Neg(x) | Operand::Sel(x, _) => fix(x, set),
            Operand::Vec(v) | Operand::List(v) => v.iter_mut().for_each(|x| fix(x, set)),
            Operand::Pair(a, b) => {
                fix(a, set);
                fix(b, set);
            }
            _ => {}
        }
    }
    fn walk(b: &mut [Statement], set: &PlainRegs) {
        for s in b {
            match s {
                Statement::Instr(i) => {
                    i.args.iter_mut().for_each(|a| fix(a, set));
                }
                Statement::Block(b) => walk(b, set),
                _ => {}
            }
        }
    }
    walk(body, &plain);
}

/// Names declared by `.reg` without a `%` prefix: single names and `name<N>` ranges.
#[derive(Default)]
struct PlainRegs {
    exact: HashSet<String>,
    ranges: HashMap<String, u32>,
}

impl PlainRegs {
    fn contains(&self, name: &str) -> bool {
        if self.exact.contains(name) {
            return true;
        }
        if let Some((base, _)) = split_component(name) {
            return self.contains(base);
        }
        let digits = name
            .bytes()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return false;
        }
        let (prefix, num) = name.split_at(name.len() - digits);
        if num.len() > 1 && num.starts_with('0') {
            return false;
        }
        match (self.ranges.get(prefix), num.parse::<u64>()) {
            (Some(&c), Ok(n)) => n < c as u64,
            _ => false,
        }
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Dot(s) => format!("`.{s}`"),
        Tok::Num(s) => format!("number `{s}`"),
        Tok::Str(s) => format!("string \"{s}\""),
        Tok::Punct(c) => format!("`{}`", *c as char),
        Tok::Eof => "end of file".to_string(),
    }
}

fn parse_version(s: &str) -> Option<u32> {
    let (a, b) = s.split_once('.')?;
    // checked: `.version 4294967295.8` must be an error, not a panic or a wrapped version
    a.parse::<u32>()
        .ok()?
        .checked_mul(10)?
        .checked_add(b.parse::<u32>().ok()?)
}

/// Parses an unsigned integer literal (decimal, hex, octal, binary, optional `U`).
pub(crate) fn parse_uint(s: &str) -> Option<u64> {
    let s = s.strip_suffix(['U', 'u']).unwrap_or(s);
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(b) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        u64::from_str_radix(b, 2).ok()
    } else if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

/// Parses any numeric literal into an immediate.
pub(crate) fn parse_num(s: &str, f64_ctx: bool) -> Option<Imm> {
    let b = s.as_bytes();
    if b.len() > 2 && b[0] == b'0' && matches!(b[1], b'f' | b'F') && b.len() == 10 {
        return u32::from_str_radix(&s[2..], 16).ok().map(Imm::F32);
    }
    if b.len() > 2 && b[0] == b'0' && matches!(b[1], b'd' | b'D') && b.len() == 18 {
        return u64::from_str_radix(&s[2..], 16).ok().map(Imm::F64);
    }
    if s.contains('.') || (s.contains(['e', 'E']) && !s.starts_with("0x") && !s.starts_with("0X")) {
        let v: f64 = s.parse().ok()?;
        return Some(if f64_ctx {
            Imm::F64(v.to_bits())
        } else {
            Imm::F32((v as f32).to_bits())
        });
    }
    let u = parse_uint(s)?;
    Some(if u <= i64::MAX as u64 {
        Imm::Int(u as i64)
    } else {
        Imm::U64(u)
    })
}
