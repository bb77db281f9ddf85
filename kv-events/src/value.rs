//! A msgpack value of no fixed schema: vLLM's `extra_keys` are typed `Any`.

use crate::cbor::CborValue;

/// A decoded msgpack value, owned, so that the public API does not expose the
/// msgpack crate's types.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Every msgpack integer fits: they span `-2^63 ..= 2^64 - 1`.
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Ext(i8, Vec<u8>),
}

impl Value {
    /// The CBOR value Python would have hashed for this one, if it has one.
    ///
    /// In vLLM up to 0.20 the published `extra_keys` were the hash input itself
    /// (msgspec turns tuples into arrays, which CBOR-encode the same as tuples),
    /// so converting them back lets a consumer recompute a block hash from the event
    /// alone. Floats, maps and ext values never occur in block keys and give `None`.
    pub fn to_cbor(&self) -> Option<CborValue> {
        Some(match self {
            Value::Nil => CborValue::Null,
            Value::Bool(b) => CborValue::Bool(*b),
            Value::Int(i) => CborValue::Int(*i),
            Value::Str(s) => CborValue::Text(s.clone()),
            Value::Bin(b) => CborValue::Bytes(b.clone()),
            Value::Array(items) => {
                CborValue::Array(items.iter().map(Value::to_cbor).collect::<Option<_>>()?)
            }
            Value::Float(_) | Value::Map(_) | Value::Ext(..) => return None,
        })
    }
}
