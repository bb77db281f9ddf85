//! Constants of the proxy-wasm ABI 0.2.1 (as in the SDK's `types.rs`) and the
//! pairs serialization used for header maps.

/// Status codes returned to the guest (`WasmResult` in Envoy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// Key, queue, token, metric, property, function... not found.
    NotFound = 1,
    /// Argument rejected (unknown cluster, unavailable map, bad shape...).
    BadArgument = 2,
    /// A value could not be serialized.
    SerializationFailure = 3,
    /// A value could not be parsed.
    ParseFailure = 4,
    /// Queue empty.
    Empty = 7,
    /// Shared-data compare-and-swap mismatch.
    CasMismatch = 8,
    /// Host-side failure.
    InternalFailure = 10,
    /// The connection of an HTTP call broke.
    BrokenConnection = 11,
    /// Not implemented by this host.
    Unimplemented = 12,
}

impl Status {
    /// The value handed back to the guest.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Log levels (`LogLevel` in the SDK).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// 0
    Trace,
    /// 1
    Debug,
    /// 2
    Info,
    /// 3
    Warn,
    /// 4
    Error,
    /// 5
    Critical,
}

impl LogLevel {
    /// From the ABI value; `None` when out of range.
    pub fn from_raw(v: i32) -> Option<Self> {
        Some(match v {
            0 => Self::Trace,
            1 => Self::Debug,
            2 => Self::Info,
            3 => Self::Warn,
            4 => Self::Error,
            5 => Self::Critical,
            _ => return None,
        })
    }

    /// The ABI value.
    pub fn raw(self) -> i32 {
        self as i32
    }
}

/// `BufferType` values.
pub mod buffer {
    pub const HTTP_REQUEST_BODY: i32 = 0;
    pub const HTTP_RESPONSE_BODY: i32 = 1;
    pub const DOWNSTREAM_DATA: i32 = 2;
    pub const UPSTREAM_DATA: i32 = 3;
    pub const HTTP_CALL_RESPONSE_BODY: i32 = 4;
    pub const GRPC_RECEIVE_BUFFER: i32 = 5;
    pub const VM_CONFIGURATION: i32 = 6;
    pub const PLUGIN_CONFIGURATION: i32 = 7;
    pub const CALL_DATA: i32 = 8;
}

/// `MapType` values.
pub mod map {
    pub const HTTP_REQUEST_HEADERS: i32 = 0;
    pub const HTTP_REQUEST_TRAILERS: i32 = 1;
    pub const HTTP_RESPONSE_HEADERS: i32 = 2;
    pub const HTTP_RESPONSE_TRAILERS: i32 = 3;
    pub const GRPC_RECEIVE_INITIAL_METADATA: i32 = 4;
    pub const GRPC_RECEIVE_TRAILING_METADATA: i32 = 5;
    pub const HTTP_CALL_RESPONSE_HEADERS: i32 = 6;
    pub const HTTP_CALL_RESPONSE_TRAILERS: i32 = 7;
}

/// `StreamType` values.
pub mod stream {
    pub const HTTP_REQUEST: i32 = 0;
    pub const HTTP_RESPONSE: i32 = 1;
    pub const DOWNSTREAM: i32 = 2;
    pub const UPSTREAM: i32 = 3;
}

/// `MetricType` values.
pub mod metric {
    pub const COUNTER: i32 = 0;
    pub const GAUGE: i32 = 1;
    pub const HISTOGRAM: i32 = 2;
}

/// A header list, in order, as raw bytes.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Serializes pairs like the SDK: `u32 count`, then `count * (u32 key_len, u32 value_len)`,
/// then each key and value followed by a NUL byte. All integers little endian.
pub fn serialize_pairs(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Parses the SDK pairs format; `None` when malformed. Empty input is an empty map.
pub fn deserialize_pairs(bytes: &[u8]) -> Option<Pairs> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = word(0)?;
    let mut data = count.checked_mul(8)?.checked_add(4)?;
    if data > bytes.len() {
        return None;
    }
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let klen = word(4 + i * 8)?;
        let vlen = word(8 + i * 8)?;
        let key = bytes.get(data..data.checked_add(klen)?)?.to_vec();
        data += klen + 1;
        let value = bytes.get(data..data.checked_add(vlen)?)?.to_vec();
        data += vlen + 1;
        if data > bytes.len() {
            return None;
        }
        pairs.push((key, value));
    }
    Some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![
            (b":path".to_vec(), b"/x".to_vec()),
            (b"empty".to_vec(), Vec::new()),
        ];
        let bytes = serialize_pairs(&pairs);
        assert_eq!(deserialize_pairs(&bytes), Some(pairs));
        assert_eq!(deserialize_pairs(&[]), Some(vec![]));
        assert_eq!(deserialize_pairs(&serialize_pairs(&[])), Some(vec![]));
    }

    #[test]
    fn malformed_pairs_are_rejected() {
        assert_eq!(deserialize_pairs(&[1, 0]), None);
        assert_eq!(
            deserialize_pairs(&[1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, b'a']),
            None
        );
        assert_eq!(deserialize_pairs(&[255, 255, 255, 255]), None);
    }
}
