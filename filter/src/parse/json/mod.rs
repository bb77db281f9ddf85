//! The JSON reader the body readers (`fields`, `inputs`) pull from. It takes the
//! place of serde_json's deserializer on the hot path because a prompt's kilobytes
//! are almost all string contents, and this reader crosses them 16 bytes a step
//! (`scan::plain_string_text`) where serde_json's scan takes 4 on wasm32; it also
//! leaves out the visitor dispatch and checks nothing twice.
//!
//! It accepts and refuses exactly what serde_json did in the places it read, so a
//! body routes as it always has:
//! - a value the readers look at (`token`) is read in full: its string is unescaped
//!   and must be UTF-8 with paired surrogates, its number is classified (and refused
//!   if it overflows an f64), an object's keys are read as such strings;
//! - a value they skip (`skip`) is only checked for syntax, as serde's `IgnoredAny`:
//!   escapes must be well formed, but its strings' bytes and its numbers' sizes are
//!   not looked at.

mod plain;

use crate::scan;
use std::borrow::Cow;

/// The body is not the JSON the readers accept. Why does not matter: every refusal
/// routes the same way (`Unreadable::NotJson`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Malformed;

pub(super) type Read<T> = Result<T, Malformed>;

/// One value, as far as its first token: a scalar whole, a container opened (the
/// caller walks or drains it).
pub(super) enum Token<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    /// A non-negative integer that fits a u64.
    U64(u64),
    /// Any other number (negative, fractional, exponent, past u64).
    OtherNumber,
    Null,
    Array(Items),
    Object(Entries),
}

impl Token<'_> {
    /// Consumes the rest of an opened container; a scalar is already whole.
    pub(super) fn drain(self, json: &mut Json) -> Read<()> {
        match self {
            Token::Array(items) => items.drain(json),
            Token::Object(entries) => entries.drain(json),
            _ => Ok(()),
        }
    }
}

/// A body being read, and how far. A copy is a place to come back to.
#[derive(Clone, Copy)]
pub(super) struct Json<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Json<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Json<'a> {
        Json { bytes, at: 0 }
    }

    /// The next byte that is not JSON whitespace, left unread.
    fn peek(&mut self) -> Option<u8> {
        self.at = self.skip_space(self.at);
        self.bytes.get(self.at).copied()
    }

    /// Reads `byte` after any whitespace.
    fn eat(&mut self, byte: u8) -> Read<()> {
        self.at = self.after(self.at, byte).ok_or(Malformed)?;
        Ok(())
    }

    /// Past `byte` if it is the first non-whitespace byte from `at`.
    fn after(&self, at: usize, byte: u8) -> Option<usize> {
        let at = self.skip_space(at);
        (self.bytes.get(at) == Some(&byte)).then_some(at + 1)
    }

    /// The first index from `at` that is not JSON whitespace.
    fn skip_space(&self, mut at: usize) -> usize {
        while self
            .bytes
            .get(at)
            .is_some_and(|b| matches!(b, b' ' | b'\n' | b'\t' | b'\r'))
        {
            at += 1;
        }
        at
    }

    /// Whether the next value is `null`, reading it if so (serde's `Option`).
    pub(super) fn null(&mut self) -> Read<bool> {
        if self.peek() != Some(b'n') {
            return Ok(false);
        }
        self.literal(b"null")?;
        Ok(true)
    }

    /// Reads the next value's first token (see the module's doc for what it checks).
    pub(super) fn token(&mut self) -> Read<Token<'a>> {
        Ok(match self.peek().ok_or(Malformed)? {
            b'"' => {
                self.at += 1;
                Token::Str(self.string()?)
            }
            b'[' => {
                self.at += 1;
                Token::Array(Items { first: true })
            }
            b'{' => {
                self.at += 1;
                Token::Object(Entries { first: true })
            }
            b't' => {
                self.literal(b"true")?;
                Token::Bool(true)
            }
            b'f' => {
                self.literal(b"false")?;
                Token::Bool(false)
            }
            b'n' => {
                self.literal(b"null")?;
                Token::Null
            }
            _ => self.number()?,
        })
    }

    /// Only whitespace may follow the body's value.
    pub(super) fn end(&mut self) -> Read<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Malformed),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Read<()> {
        let end = self.at + word.len();
        if self.bytes.get(self.at..end) != Some(word) {
            return Err(Malformed);
        }
        self.at = end;
        Ok(())
    }

    /// A string's contents after its opening quote, unescaped and checked as UTF-8;
    /// borrowed from the body unless it has escapes.
    fn string(&mut self) -> Read<Cow<'a, str>> {
        let mut unescaped: Option<String> = None;
        loop {
            let (n, run) = scan::plain_string_text(self.rest());
            self.at += n;
            let run = run.ok_or(Malformed)?;
            match self.bytes.get(self.at) {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(match unescaped {
                        None => Cow::Borrowed(run),
                        Some(mut text) => {
                            text.push_str(run);
                            Cow::Owned(text)
                        }
                    });
                }
                Some(b'\\') => {
                    let text = unescaped.get_or_insert_with(String::new);
                    text.push_str(run);
                    self.at += 1;
                    self.unescape(text)?;
                }
                // A control byte, or the body ended inside the string.
                _ => return Err(Malformed),
            }
        }
    }

    /// One escape after its backslash, appended to `text`. A `\u` escape of a
    /// surrogate must be the first of a pair.
    fn unescape(&mut self, text: &mut String) -> Read<()> {
        let escape = self.next()?;
        let c = match simple_escape(escape) {
            Some(c) => c,
            None if escape == b'u' => {
                let unit = self.hex4()?;
                let code = match unit {
                    0xD800..=0xDBFF => {
                        if self.next()? != b'\\' || self.next()? != b'u' {
                            return Err(Malformed);
                        }
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(Malformed);
                        }
                        0x1_0000 + ((u32::from(unit) - 0xD800) << 10 | (u32::from(low) - 0xDC00))
                    }
                    0xDC00..=0xDFFF => return Err(Malformed),
                    _ => u32::from(unit),
                };
                char::from_u32(code).ok_or(Malformed)?
            }
            None => return Err(Malformed),
        };
        text.push(c);
        Ok(())
    }

    fn next(&mut self) -> Read<u8> {
        let b = *self.bytes.get(self.at).ok_or(Malformed)?;
        self.at += 1;
        Ok(b)
    }

    fn hex4(&mut self) -> Read<u16> {
        let digits = self.bytes.get(self.at..self.at + 4).ok_or(Malformed)?;
        let mut unit = 0u16;
        for &d in digits {
            let v = char::from(d).to_digit(16).ok_or(Malformed)?;
            unit = unit << 4 | v as u16;
        }
        self.at += 4;
        Ok(unit)
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.at..).unwrap_or_default()
    }

    /// A number, classified. Like serde_json, one that overflows an f64 is refused.
    fn number(&mut self) -> Read<Token<'a>> {
        let start = self.at;
        let shape = self.number_syntax()?;
        let text = self.bytes.get(start..self.at).ok_or(Malformed)?;
        if shape == NumberShape::Natural {
            // Digits only: a u64 unless it is too long for one.
            let value = text.iter().try_fold(0u64, |n, &d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            });
            if let Some(n) = value {
                return Ok(Token::U64(n));
            }
        }
        let finite = std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .is_some_and(f64::is_finite);
        if finite {
            Ok(Token::OtherNumber)
        } else {
            Err(Malformed)
        }
    }

    /// Reads a number's JSON syntax: `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)?
    /// ([eE] [+-]? [0-9]+)?.
    fn number_syntax(&mut self) -> Read<NumberShape> {
        let mut shape = NumberShape::Natural;
        if self.bytes.get(self.at) == Some(&b'-') {
            self.at += 1;
            shape = NumberShape::Other;
        }
        match self.next()? {
            b'0' => {
                if self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
                    return Err(Malformed);
                }
            }
            b'1'..=b'9' => self.digits(),
            _ => return Err(Malformed),
        }
        if self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            shape = NumberShape::Other;
            self.some_digits()?;
        }
        if matches!(self.bytes.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            shape = NumberShape::Other;
            if matches!(self.bytes.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Ok(shape)
    }

    fn digits(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Read<()> {
        let start = self.at;
        self.digits();
        if self.at == start {
            return Err(Malformed);
        }
        Ok(())
    }

    /// Skips one value, checking only its syntax (serde's `IgnoredAny`). Nesting is
    /// followed on a stack of its own, not by recursion, so no depth overflows it.
    pub(super) fn skip(&mut self) -> Read<()> {
        // The closing byte of each container entered.
        let mut open: Vec<u8> = Vec::new();
        loop {
            match self.peek().ok_or(Malformed)? {
                b'"' => {
                    self.at += 1;
                    self.skip_string()?;
                }
                bracket @ (b'[' | b'{') => {
                    let close = if bracket == b'[' { b']' } else { b'}' };
                    self.at += 1;
                    if self.peek() == Some(close) {
                        self.at += 1;
                    } else {
                        open.push(close);
                        if close == b'}' {
                            self.skip_key()?;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => {
                    self.number_syntax()?;
                }
            }
            // A value is whole: close what it ends, or go on past a comma.
            loop {
                let Some(&close) = open.last() else {
                    return Ok(());
                };
                match self.peek() {
                    Some(b',') => {
                        self.at += 1;
                        if close == b'}' {
                            self.skip_key()?;
                        }
                        break;
                    }
                    Some(b) if b == close => {
                        self.at += 1;
                        open.pop();
                    }
                    _ => return Err(Malformed),
                }
            }
        }
    }

    /// A skipped object's key and its colon.
    fn skip_key(&mut self) -> Read<()> {
        self.eat(b'"')?;
        self.skip_string()?;
        self.eat(b':')
    }

    /// A skipped string's contents after its opening quote: escapes must be well
    /// formed, nothing else is checked.
    fn skip_string(&mut self) -> Read<()> {
        loop {
            self.at += scan::plain_string_len(self.rest());
            match self.next()? {
                b'"' => return Ok(()),
                b'\\' => match self.next()? {
                    b'u' => {
                        self.hex4()?;
                    }
                    escape if simple_escape(escape).is_none() => return Err(Malformed),
                    _ => {}
                },
                _ => return Err(Malformed),
            }
        }
    }
}

/// The char a one-letter escape (after its backslash) stands for; `None` for `u`
/// (four hex digits follow) and for anything JSON does not allow.
fn simple_escape(escape: u8) -> Option<char> {
    Some(match escape {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumberShape {
    /// Digits only.
    Natural,
    Other,
}

/// An array being walked: `next` says whether another element follows (the caller
/// then reads it, with `token` or `skip`).
pub(super) struct Items {
    first: bool,
}

impl Items {
    pub(super) fn next(&mut self, json: &mut Json) -> Read<bool> {
        match json.peek() {
            Some(b']') => {
                json.at += 1;
                Ok(false)
            }
            Some(b',') if !self.first => {
                json.at += 1;
                match json.peek() {
                    Some(b']') | None => Err(Malformed),
                    Some(_) => Ok(true),
                }
            }
            Some(_) if self.first => {
                self.first = false;
                Ok(true)
            }
            _ => Err(Malformed),
        }
    }

    /// Skips the elements left.
    pub(super) fn drain(mut self, json: &mut Json) -> Read<()> {
        while self.next(json)? {
            json.skip()?;
        }
        Ok(())
    }
}

/// An object being walked: `next` reads the next key (unescaped, as a looked-at
/// string) and its colon; the caller then reads or skips the value.
pub(super) struct Entries {
    first: bool,
}

impl Entries {
    pub(super) fn next<'a>(&mut self, json: &mut Json<'a>) -> Read<Option<Cow<'a, str>>> {
        match json.peek() {
            Some(b'}') => {
                json.at += 1;
                return Ok(None);
            }
            Some(b',') if !self.first => json.at += 1,
            Some(_) if self.first => self.first = false,
            _ => return Err(Malformed),
        }
        json.eat(b'"')?;
        let key = json.string()?;
        json.eat(b':')?;
        Ok(Some(key))
    }

    /// Skips the entries left (their keys are still read as strings, as serde did).
    pub(super) fn drain(mut self, json: &mut Json) -> Read<()> {
        while self.next(json)?.is_some() {
            json.skip()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Reads `body` as one looked-at value, rendered back to compare.
    fn read(body: &str) -> Read<String> {
        fn value(json: &mut Json) -> Read<String> {
            Ok(match json.token()? {
                Token::Str(s) => format!("s:{s}"),
                Token::Bool(b) => format!("b:{b}"),
                Token::U64(n) => format!("u:{n}"),
                Token::OtherNumber => "n".into(),
                Token::Null => "null".into(),
                Token::Array(mut items) => {
                    let mut out = Vec::new();
                    while items.next(json)? {
                        out.push(value(json)?);
                    }
                    format!("[{}]", out.join(","))
                }
                Token::Object(mut entries) => {
                    let mut out = Vec::new();
                    while let Some(k) = entries.next(json)? {
                        out.push(format!("{k}={}", value(json)?));
                    }
                    format!("{{{}}}", out.join(","))
                }
            })
        }
        let mut json = Json::new(body.as_bytes());
        let v = value(&mut json)?;
        json.end()?;
        Ok(v)
    }

    fn skipped(body: &[u8]) -> Read<()> {
        let mut json = Json::new(body);
        json.skip()?;
        json.end()
    }

    #[test]
    fn values_read_as_serde_json_reads_them() {
        assert_eq!(
            read(r#" {"a" : [1, -2, 0.5, 1e3, true, null, "x"], "b":{}} "#),
            Ok("{a=[u:1,n,n,n,b:true,null,s:x],b={}}".into())
        );
        assert_eq!(
            read("18446744073709551615"),
            Ok("u:18446744073709551615".into())
        );
        assert_eq!(read("18446744073709551616"), Ok("n".into()), "past u64");
        assert_eq!(read("-0"), Ok("n".into()));
        assert_eq!(
            read(r#""a\"\\\/\b\f\n\r\t\u00e9\ud83e\udd80""#),
            Ok("s:a\"\\/\u{8}\u{c}\n\r\té🦀".into())
        );
        assert_eq!(
            read(r#"{"ro\u006ce":1}"#),
            Ok("{role=u:1}".into()),
            "keys unescape"
        );
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "[",
            "[1,]",
            "[,1]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "[1 2]",
            "01",
            "1.",
            ".5",
            "1e",
            "-",
            "+1",
            "tru",
            "nul",
            "\"open",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}\"",
            "1e400",
            "-1e400",
            "[1]]",
            "{}x",
            "\"\\ud83e\"",
            "\"\\udd80\"",
            "\"\\ud83e\\u0041\"",
        ] {
            assert_eq!(read(bad), Err(Malformed), "{bad:?}");
        }
        let invalid_utf8 = b"\"\xff\"";
        let mut json = Json::new(invalid_utf8);
        assert!(json.token().is_err(), "a looked-at string must be UTF-8");
    }

    #[test]
    fn skipping_checks_syntax_only() {
        assert_eq!(
            skipped(b"[1e400, \"\\ud83e\", \"\xff\", {\"\xfe\": [[]]}]"),
            Ok(())
        );
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(skipped(deep.as_bytes()), Ok(()), "depth costs no stack");
        for bad in [
            &b"[1,]"[..],
            b"[1 2]",
            b"{\"a\":}",
            b"{\"a\",1}",
            b"{a:1}",
            b"[}",
            b"{]",
            b"01",
            b"\"\\q\"",
            b"\"\\u00g0\"",
            b"\"a\x1fb\"",
            b"[[]",
            b"",
            b"{\"a\":1,}",
        ] {
            assert_eq!(
                skipped(bad),
                Err(Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
