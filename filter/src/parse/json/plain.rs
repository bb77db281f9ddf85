//! The one-pass read of the object clients send most: two members whose keys and
//! string values have no escapes (a chat message, `{"role":"…","content":"…"}`).
//! The general readers take such an object a token at a time, several times the
//! cost; this one either reads it whole or reads nothing, so the general readers
//! still take everything else from where it stands.

use super::Json;
use crate::scan;

/// A member as read here: its key's bytes (no escapes, so as written) and value.
pub(in crate::parse) type PlainMember<'a> = (&'a [u8], &'a str);

impl<'a> Json<'a> {
    /// `{ "key" : "value" , "key" : "value" }` next (JSON whitespace allowed
    /// between tokens), the keys and values free of escapes and the values UTF-8:
    /// the two members in order, the reader past the object. Anything else gives
    /// `None` and reads nothing.
    pub(in crate::parse) fn plain_pair(&mut self) -> Option<[PlainMember<'a>; 2]> {
        let (at, first) = self.plain_member(self.at, b'{')?;
        let (at, second) = self.plain_member(at, b',')?;
        self.at = self.after(at, b'}')?;
        Some([first, second])
    }

    /// `lead "key" : "value"` from `at`, whitespace allowed between: where it
    /// ends, and the member.
    fn plain_member(&self, at: usize, lead: u8) -> Option<(usize, PlainMember<'a>)> {
        let at = self.after(at, lead)?;
        let (at, key) = self.plain_string(self.after(at, b'"')?)?;
        let at = self.after(at, b':')?;
        let (at, value) = self.plain_string(self.after(at, b'"')?)?;
        Some((at, (key.as_bytes(), value)))
    }

    /// A string's contents from `at` (past its opening quote) when they run to its
    /// closing quote without an escape and are UTF-8: where it ends, and the text.
    fn plain_string(&self, at: usize) -> Option<(usize, &'a str)> {
        let rest = self.bytes.get(at..)?;
        let (n, text) = scan::plain_string_text(rest);
        (rest.get(n) == Some(&b'"')).then_some((at + n + 1, text?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_plain_pair_is_read_whole_or_not_at_all() {
        for (body, want) in [
            (
                r#"{"role":"user","content":"hi"}"#,
                Some([(&b"role"[..], "user"), (&b"content"[..], "hi")]),
            ),
            (
                " { \"a\" :\t\"u\" ,\n\"b\": \"日本\" } ",
                Some([(&b"a"[..], "u"), (&b"b"[..], "日本")]),
            ),
            (r#"{"":"","":""}"#, Some([(&b""[..], ""), (&b""[..], "")])),
            (r#"{"a":"x\"y","b":"z"}"#, None),
            (r#"{"a\u0062":"x","b":"z"}"#, None),
            (r#"{"a":["x"],"b":"z"}"#, None),
            (r#"{"a":1,"b":"z"}"#, None),
            (r#"{"a":"x","b":"y","c":"z"}"#, None),
            (r#"{"a":"x"}"#, None),
            ("{\"a\":\"u\u{1}\",\"b\":\"x\"}", None),
            (r#"{"a":"x","b":"y""#, None),
            (r#"["a","b"]"#, None),
        ] {
            let mut json = Json::new(body.as_bytes());
            let got = json.plain_pair();
            assert_eq!(got, want, "{body}");
            let end = if got.is_some() {
                body.trim_end().len()
            } else {
                0
            };
            assert_eq!(json.at, end, "read past the object, or nothing: {body}");
        }
        // Not UTF-8: the general reader refuses it.
        let mut json = Json::new(b"{\"a\":\"\xff\",\"b\":\"x\"}");
        assert_eq!(json.plain_pair(), None);
        assert_eq!(json.at, 0);
    }
}
