//! The pairs serialization the proxy-wasm ABI uses for header maps (the SDK's format),
//! and conversions between its raw bytes and the lower-cased string headers the host
//! keeps. Malformed input is `None` so that a hostcall can answer BadArgument.

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

/// Raw pairs as the host's headers: names lower-cased (as Envoy's header maps), both
/// lossy UTF-8.
pub fn pairs_to_strings(pairs: Pairs) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(&k).to_ascii_lowercase(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect()
}

/// The host's headers as raw pairs, for [`serialize_pairs`].
pub fn strings_to_pairs(pairs: &[(String, String)]) -> Pairs {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
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
