//! Byte-level tokenizer for PTX. Tokens borrow from the source; each carries its line, column
//! and whether whitespace preceded it (the parser needs that to glue `ld` `.global` `.u32`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok<'a> {
    /// `%r1`, `$L__BB0_2`, `foo`, `_` (may contain `::`).
    Ident(&'a str),
    /// `.global`, `.shared::cta`, `.L2::256B` (text without the dot).
    Dot(&'a str),
    /// A numeric literal as written (`42`, `0x1F`, `0f3F800000`, `1.5`, `8.4`).
    Num(&'a str),
    Str(&'a str),
    Punct(u8),
    Eof,
}

#[derive(Clone, Copy, Debug)]
pub struct Token<'a> {
    pub tok: Tok<'a>,
    pub line: u32,
    pub col: u32,
    /// Whitespace or a comment came right before this token.
    pub spaced: bool,
}

pub struct Lexer<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
    line: u32,
    line_start: usize,
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'$' || c == b'%'
}
fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

impl<'a> Lexer<'a> {
    pub fn new(text: &'a str) -> Lexer<'a> {
        Lexer {
            src: text.as_bytes(),
            text,
            pos: 0,
            line: 1,
            line_start: 0,
        }
    }

    /// The full text of a 1-based line (for diagnostics).
    pub fn line_text(text: &str, line: u32) -> &str {
        text.lines()
            .nth(line.saturating_sub(1) as usize)
            .unwrap_or("")
    }

    /// Skips the rest of the current line (for `.loc` / `.file`, which have no `;`).
    pub fn skip_line(&mut self) {
        while self.pos < self.src.len() && self.src[self.pos] != b'\n' {
            self.pos += 1;
        }
    }

    /// Skips whitespace and comments; returns whether anything was skipped.
    fn skip_ws(&mut self) -> Result<bool, (u32, u32, &'static str)> {
        let start = self.pos;
        while let Some(&c) = self.src.get(self.pos) {
            match c {
                b'\n' => {
                    self.pos += 1;
                    self.line += 1;
                    self.line_start = self.pos;
                }
                b' ' | b'\t' | b'\r' | 0x0c => self.pos += 1,
                b'/' if self.src.get(self.pos + 1) == Some(&b'/') => self.skip_line(),
                b'/' if self.src.get(self.pos + 1) == Some(&b'*') => {
                    let (l, c0) = (self.line, (self.pos - self.line_start) as u32 + 1);
                    self.pos += 2;
                    loop {
                        match self.src.get(self.pos) {
                            None => return Err((l, c0, "unterminated block comment")),
                            Some(b'*') if self.src.get(self.pos + 1) == Some(&b'/') => {
                                self.pos += 2;
                                break;
                            }
                            Some(b'\n') => {
                                self.pos += 1;
                                self.line += 1;
                                self.line_start = self.pos;
                            }
                            Some(_) => self.pos += 1,
                        }
                    }
                }
                _ => break,
            }
        }
        Ok(self.pos != start)
    }

    pub fn next(&mut self) -> Result<Token<'a>, (u32, u32, &'static str)> {
        let spaced = self.skip_ws()?;
        let line = self.line;
        let col = (self.pos - self.line_start) as u32 + 1;
        let mk = |tok| {
            Ok(Token {
                tok,
                line,
                col,
                spaced,
            })
        };
        let Some(&c) = self.src.get(self.pos) else {
            return mk(Tok::Eof);
        };
        let start = self.pos;
        if c == b'.'
            && self
                .src
                .get(self.pos + 1)
                .is_some_and(|&d| ident_start(d) || d.is_ascii_digit())
        {
            self.pos += 1;
            self.eat_ident_body();
            return mk(Tok::Dot(&self.text[start + 1..self.pos]));
        }
        if ident_start(c) {
            self.pos += 1;
            self.eat_ident_body();
            return mk(Tok::Ident(&self.text[start..self.pos]));
        }
        if c.is_ascii_digit() {
            self.pos += 1;
            let hexlike = c == b'0'
                && matches!(
                    self.src.get(self.pos),
                    Some(b'x' | b'X' | b'f' | b'F' | b'd' | b'D' | b'b' | b'B')
                );
            if hexlike {
                self.pos += 1;
                while self
                    .src
                    .get(self.pos)
                    .is_some_and(|d| d.is_ascii_hexdigit())
                {
                    self.pos += 1;
                }
            } else {
                while self.src.get(self.pos).is_some_and(|d| d.is_ascii_digit()) {
                    self.pos += 1;
                }
                // decimal float: digits '.' digits [e[+-]digits]
                if self.src.get(self.pos) == Some(&b'.')
                    && self
                        .src
                        .get(self.pos + 1)
                        .is_some_and(|d| d.is_ascii_digit())
                {
                    self.pos += 1;
                    while self.src.get(self.pos).is_some_and(|d| d.is_ascii_digit()) {
                        self.pos += 1;
                    }
                }
                if matches!(self.src.get(self.pos), Some(b'e' | b'E'))
                    && self
                        .src
                        .get(self.pos + 1)
                        .is_some_and(|d| d.is_ascii_digit() || *d == b'-' || *d == b'+')
                {
                    self.pos += 2;
                    while self.src.get(self.pos).is_some_and(|d| d.is_ascii_digit()) {
                        self.pos += 1;
                    }
                }
            }
            if matches!(self.src.get(self.pos), Some(b'U' | b'u')) {
                self.pos += 1;
            }
            return mk(Tok::Num(&self.text[start..self.pos]));
        }
        if c == b'"' {
            self.pos += 1;
            while let Some(&d) = self.src.get(self.pos) {
                self.pos += 1;
                if d == b'"' {
                    return mk(Tok::Str(&self.text[start + 1..self.pos - 1]));
                }
                if d == b'\n' {
                    break;
                }
            }
            return Err((line, col, "unterminated string"));
        }
        if b",;:{}[]()<>+-!@|=*".contains(&c) {
            self.pos += 1;
            return mk(Tok::Punct(c));
        }
        Err((line, col, "unexpected character"))
    }

    fn eat_ident_body(&mut self) {
        loop {
            match self.src.get(self.pos) {
                Some(&d) if ident_char(d) => self.pos += 1,
                Some(b':') if self.src.get(self.pos + 1) == Some(&b':') => self.pos += 2,
                _ => break,
            }
        }
    }
}
