//! The slice of CBOR that vLLM's `sha256_cbor` block hash feeds to SHA-256.
//!
//! vLLM hashes `cbor2.dumps(value, canonical=True)`. For the values a block key is
//! made of (byte strings, text, integers, `None`, booleans and tuples of those)
//! canonical CBOR is simply every head in its shortest form, so a hand-written
//! encoder is smaller than a general CBOR crate and cannot drift from it: the
//! vectors in `vectors/cbor.json` come from `cbor2` itself.

/// A value vLLM can put in a block key.
///
/// There are no floats or maps: vLLM's keys have none, and their canonical forms
/// (shortest float, sorted keys) would be a second place to get bits wrong.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CborValue {
    /// Python `None`.
    Null,
    /// Python `bool`.
    Bool(bool),
    /// Python `int`. Values outside `-2^64 ..= 2^64 - 1` are written as the
    /// bignum tags 2 and 3, as `cbor2` does.
    Int(i128),
    /// Python `bytes`.
    Bytes(Vec<u8>),
    /// Python `str`.
    Text(String),
    /// Python `tuple` or `list`: both encode as a CBOR array.
    Array(Vec<CborValue>),
}

impl CborValue {
    /// Appends the canonical encoding of `self` to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            CborValue::Null => out.push(0xf6),
            CborValue::Bool(false) => out.push(0xf4),
            CborValue::Bool(true) => out.push(0xf5),
            CborValue::Int(v) => write_int(out, *v),
            CborValue::Bytes(b) => write_bytes(out, b),
            CborValue::Text(s) => write_text(out, s),
            CborValue::Array(items) => {
                write_head(out, MAJOR_ARRAY, items.len() as u64);
                for item in items {
                    item.encode_into(out);
                }
            }
        }
    }

    /// The canonical encoding of `self`.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }
}

impl From<&str> for CborValue {
    fn from(s: &str) -> Self {
        CborValue::Text(s.to_owned())
    }
}

impl From<String> for CborValue {
    fn from(s: String) -> Self {
        CborValue::Text(s)
    }
}

impl From<i64> for CborValue {
    fn from(v: i64) -> Self {
        CborValue::Int(v.into())
    }
}

impl From<u64> for CborValue {
    fn from(v: u64) -> Self {
        CborValue::Int(v.into())
    }
}

const MAJOR_UINT: u8 = 0;
const MAJOR_NEGINT: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
pub(crate) const MAJOR_ARRAY: u8 = 4;
const MAJOR_TAG: u8 = 6;

/// Writes a head with its argument in the shortest form, which is what makes the
/// encoding canonical for every type used here.
pub(crate) fn write_head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if let Ok(a) = u8::try_from(arg) {
        out.extend_from_slice(&[m | 24, a]);
    } else if let Ok(a) = u16::try_from(arg) {
        out.push(m | 25);
        out.extend_from_slice(&a.to_be_bytes());
    } else if let Ok(a) = u32::try_from(arg) {
        out.push(m | 26);
        out.extend_from_slice(&a.to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

pub(crate) fn write_uint(out: &mut Vec<u8>, v: u64) {
    write_head(out, MAJOR_UINT, v);
}

pub(crate) fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_head(out, MAJOR_BYTES, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) fn write_text(out: &mut Vec<u8>, s: &str) {
    write_head(out, MAJOR_TEXT, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn write_int(out: &mut Vec<u8>, v: i128) {
    if v >= 0 {
        match u64::try_from(v) {
            Ok(u) => write_uint(out, u),
            Err(_) => write_bignum(out, 2, v as u128),
        }
    } else {
        // CBOR stores a negative n as -1 - n, which is never negative.
        let magnitude = (-1 - v) as u128;
        match u64::try_from(magnitude) {
            Ok(u) => write_head(out, MAJOR_NEGINT, u),
            Err(_) => write_bignum(out, 3, magnitude),
        }
    }
}

/// cbor2 writes ints past 64 bits as tag 2 (or 3) over the big-endian magnitude
/// with no leading zero bytes.
fn write_bignum(out: &mut Vec<u8>, tag: u64, magnitude: u128) {
    write_head(out, MAJOR_TAG, tag);
    let bytes = magnitude.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    write_bytes(out, bytes.get(skip..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_take_the_shortest_form() {
        let cases: &[(i128, &[u8])] = &[
            (0, &[0x00]),
            (23, &[0x17]),
            (24, &[0x18, 0x18]),
            (255, &[0x18, 0xff]),
            (256, &[0x19, 0x01, 0x00]),
            (65_536, &[0x1a, 0, 1, 0, 0]),
            (1 << 32, &[0x1b, 0, 0, 0, 1, 0, 0, 0, 0]),
            (-1, &[0x20]),
            (-25, &[0x38, 0x18]),
        ];
        for (v, want) in cases {
            assert_eq!(CborValue::Int(*v).to_vec(), *want, "{v}");
        }
    }
}
