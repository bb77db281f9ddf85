//! The proxy-wasm serialization of a header map (a count, each pair's two lengths,
//! then every name and value NUL-terminated), read in place.
//!
//! PD's prefill copy carries the request's headers, read in one
//! `proxy_get_header_map_pairs`, and an HTTP call sends its headers this way. The
//! map comes from the host: a malformed one reads as the pairs before the damage,
//! never a panic.

/// The pairs of a serialized map, in order, as (name, value) bytes.
#[derive(Clone, Copy)]
pub struct Pairs<'a> {
    bytes: &'a [u8],
    count: usize,
    next: usize,
    /// Where the next pair's name starts.
    data: usize,
}

impl<'a> Pairs<'a> {
    pub fn new(bytes: &'a [u8]) -> Pairs<'a> {
        let count = u32_at(bytes, 0).unwrap_or(0);
        Pairs {
            bytes,
            count,
            next: 0,
            data: count.saturating_mul(8).saturating_add(4),
        }
    }
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.count {
            return None;
        }
        let lengths = self.next.checked_mul(8)?.checked_add(4)?;
        let k = u32_at(self.bytes, lengths)?;
        let v = u32_at(self.bytes, lengths.checked_add(4)?)?;
        let key_end = self.data.checked_add(k)?;
        let key = self.bytes.get(self.data..key_end)?;
        let value_start = key_end.checked_add(1)?;
        let value_end = value_start.checked_add(v)?;
        let value = self.bytes.get(value_start..value_end)?;
        self.next += 1;
        self.data = value_end.checked_add(1)?;
        Some((key, value))
    }
}

/// The little-endian `u32` at `at`, if the bytes reach that far.
fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?) as usize)
}

/// `pairs` serialized as the host reads them (a local reply's headers, an HTTP
/// call's).
pub fn serialize(pairs: &[(&str, &str)]) -> Vec<u8> {
    let data: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn owned(bytes: &[u8]) -> Vec<(String, String)> {
        Pairs::new(bytes)
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_serialized_map_reads_back_pair_by_pair() {
        let map = [
            (":path", "/v1/chat/completions"),
            (":method", "POST"),
            ("empty", ""),
            ("x-llm-router-explain", "1"),
        ];
        let bytes = serialize(&map);
        let read = owned(&bytes);
        assert_eq!(
            read,
            map.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_empty_or_absent_map_has_no_pairs() {
        assert_eq!(Pairs::new(&[]).count(), 0);
        assert_eq!(Pairs::new(&serialize(&[])).count(), 0);
        assert_eq!(Pairs::new(&[1, 0]).count(), 0);
    }

    #[test]
    fn a_damaged_map_reads_as_the_pairs_before_the_damage() {
        let whole = serialize(&[("a", "1"), ("bb", "22"), ("c", "3")]);
        // Every truncation, and every byte overwritten with every value, reads the
        // pairs up to the damage at most, without a panic.
        for cut in 0..whole.len() {
            let read = owned(&whole[..cut]);
            assert!(read.len() <= 3);
            assert_eq!(read, owned(&whole)[..read.len()]);
        }
        for at in 0..whole.len() {
            for b in [0u8, 1, 7, 0x7f, 0xff] {
                let mut bad = whole.clone();
                bad[at] = b;
                // A pair takes 8 bytes of lengths and two NULs at least.
                assert!(Pairs::new(&bad).count() <= bad.len() / 10);
            }
        }
        // A count far beyond the data stops at the data's end.
        let mut huge = whole.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Pairs::new(&huge).count() < 8);
    }
}
