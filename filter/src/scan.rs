//! Byte scans every routed request runs over its whole prompt (kilobytes, some of
//! them several times): the body's JSON strings, the UTF-8 check of the text it
//! keeps and of each routing text another thread recorded, and the tree's walk
//! comparing the text with its edges. Built
//! for wasm32 with SIMD (`.cargo/config.toml` enables `simd128`; V8 and wasmtime run
//! it), each takes 16 bytes a step in one vector instruction, where the scalar code
//! (and std's own checks, compiled without SIMD) takes 4 or 8 bytes a step on wasm32.
//! Elsewhere (native tests, a build without the feature) the portable code runs, and
//! the tests hold both to the same answers.

/// Whether every byte of `bytes` is ASCII.
pub fn is_ascii(bytes: &[u8]) -> bool {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::is_ascii(bytes)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        bytes.is_ascii()
    }
}

/// `bytes` as text if they are UTF-8: ASCII (most prompts) is checked by `is_ascii`,
/// anything else by std's full validation.
pub fn utf8(bytes: &[u8]) -> Option<&str> {
    text(bytes, is_ascii(bytes))
}

/// `bytes` as text, given whether a scan found them all ASCII (then no check is
/// needed; otherwise std's full validation).
fn text(bytes: &[u8], ascii: bool) -> Option<&str> {
    if ascii {
        // SAFETY: the caller's scan found every byte ASCII, and ASCII is UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// How many leading bytes of a JSON string's contents need no attention: the index
/// of the first quote, backslash or control byte (which ends the string, starts an
/// escape, or makes it malformed), or `bytes.len()` if there is none.
pub fn plain_string_len(bytes: &[u8]) -> usize {
    plain_run(bytes).0
}

/// `plain_string_len`, and those bytes as text if they are UTF-8, checked in the
/// same pass when they are ASCII. A string's runs between escapes can be checked
/// one by one: they end at ASCII bytes, so no char straddles two.
pub fn plain_string_text(bytes: &[u8]) -> (usize, Option<&str>) {
    let (n, ascii) = plain_run(bytes);
    (n, text(bytes.get(..n).unwrap_or_default(), ascii))
}

/// The plain run's length, and whether it is all ASCII.
fn plain_run(bytes: &[u8]) -> (usize, bool) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::plain_run(bytes)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        portable_plain_run(bytes)
    }
}

#[cfg_attr(
    all(target_arch = "wasm32", target_feature = "simd128"),
    allow(dead_code)
)]
fn portable_plain_run(bytes: &[u8]) -> (usize, bool) {
    let n = bytes
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(bytes.len());
    (n, bytes.get(..n).unwrap_or_default().is_ascii())
}

/// How many leading bytes `a` and `b` share.
pub fn common_len(a: &[u8], b: &[u8]) -> usize {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::common_len(a, b)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        portable_common_len(a, b)
    }
}

/// `s` from byte `n` on (empty past its end).
fn rest(s: &[u8], n: usize) -> &[u8] {
    s.get(n..).unwrap_or_default()
}

/// `common_len` eight bytes a step.
#[cfg_attr(
    all(target_arch = "wasm32", target_feature = "simd128"),
    allow(dead_code)
)]
fn portable_common_len(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let (Ok(x), Ok(y)) = (<[u8; 8]>::try_from(x), <[u8; 8]>::try_from(y)) else {
            break;
        };
        let diff = u64::from_le_bytes(x) ^ u64::from_le_bytes(y);
        if diff != 0 {
            // Little-endian: the lowest set bit is in the first differing byte.
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    let (a, b) = (rest(a, n), rest(b, n));
    n + a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd {
    use core::arch::wasm32::{
        i8x16_all_true, i8x16_eq, i8x16_lt, i8x16_min, i8x16_splat, u8x16_bitmask, u8x16_lt,
        u8x16_splat, v128, v128_and, v128_any_true, v128_load, v128_or, v128_xor,
    };

    /// 16 bytes as a vector.
    fn load(chunk: &[u8; 16]) -> v128 {
        // SAFETY: the reference is valid for 16 bytes, and `v128_load` accepts any
        // alignment.
        unsafe { v128_load(chunk.as_ptr().cast::<v128>()) }
    }

    fn chunks(bytes: &[u8]) -> impl Iterator<Item = &[u8; 16]> {
        bytes.chunks_exact(16).filter_map(|c| c.try_into().ok())
    }

    pub fn is_ascii(bytes: &[u8]) -> bool {
        // The high bits of every byte ORed together, 64 bytes a step and then 16:
        // one test at the end.
        let blocked = bytes.len() - bytes.len() % 64;
        let high = blocks(bytes).fold(u8x16_splat(0), |acc, b| v128_or(acc, any4(load4(b))));
        let rest = super::rest(bytes, blocked);
        let high = chunks(rest).fold(high, |acc, c| v128_or(acc, load(c)));
        let whole = rest.len() - rest.len() % 16;
        u8x16_bitmask(high) == 0 && super::rest(rest, whole).is_ascii()
    }

    /// 64 bytes as four vectors.
    fn load4(block: &[u8; 64]) -> [v128; 4] {
        let at = |i: usize| {
            // SAFETY: `i` is 0, 16, 32 or 48, so the 16 bytes read are inside the
            // block, and `v128_load` accepts any alignment.
            unsafe { v128_load(block.as_ptr().add(i).cast::<v128>()) }
        };
        [at(0), at(16), at(32), at(48)]
    }

    fn blocks(bytes: &[u8]) -> impl Iterator<Item = &[u8; 64]> {
        bytes.chunks_exact(64).filter_map(|c| c.try_into().ok())
    }

    /// 128 bytes as eight vectors.
    fn load8(pair: &[u8; 128]) -> [v128; 8] {
        let at = |i: usize| {
            // SAFETY: `i` is a multiple of 16 below 128, so the 16 bytes read are
            // inside the pair, and `v128_load` accepts any alignment.
            unsafe { v128_load(pair.as_ptr().add(i).cast::<v128>()) }
        };
        [
            at(0),
            at(16),
            at(32),
            at(48),
            at(64),
            at(80),
            at(96),
            at(112),
        ]
    }

    /// Two blocks a step, for the runs of kilobytes a prompt has: each trip of a
    /// loop in V8 pays a fixed cost (its interrupt check, the iterator's bounds,
    /// what it sets up again each trip), so a longer trip pays it once for twice
    /// the bytes (`benches/envoy-profile --loops plain_run` shows V8's trip: about
    /// 67 instructions per 128 bytes, where two 64-byte trips take 94).
    fn pairs(bytes: &[u8]) -> impl Iterator<Item = &[u8; 128]> {
        bytes.chunks_exact(128).filter_map(|c| c.try_into().ok())
    }

    /// Whether no byte of `v` stops a plain run or is past ASCII: `stop_or_high`
    /// for eight vectors, with the flipped vectors' signed minimum compared once.
    fn quiet(v: [v128; 8]) -> bool {
        let [a, b, c, d, e, f, g, h] = v.map(flipped);
        let least = i8x16_min(
            i8x16_min(i8x16_min(a, b), i8x16_min(c, d)),
            i8x16_min(i8x16_min(e, f), i8x16_min(g, h)),
        );
        let [a, b, c, d, e, f, g, h] = v.map(backslashes);
        let stops = v128_or(
            below_plain(least),
            v128_or(any4([a, b, c, d]), any4([e, f, g, h])),
        );
        !v128_any_true(stops)
    }

    /// Where a string's plain run stops: a quote, a backslash or a control byte.
    fn stops(v: v128) -> v128 {
        let (quote, backslash, space) = (u8x16_splat(b'"'), u8x16_splat(b'\\'), u8x16_splat(0x20));
        v128_or(
            v128_or(i8x16_eq(v, quote), i8x16_eq(v, backslash)),
            u8x16_lt(v, space),
        )
    }

    /// Bytes that stop a plain run or are not ASCII, in one xor and two compares:
    /// `v ^ 2` keeps 0x00-0x1f among themselves, turns the quote (0x22) into 0x20
    /// and every other plain ASCII byte into one above it, and keeps the high bit,
    /// which makes a byte past ASCII negative; the backslash is compared alone.
    fn stop_or_high(v: v128) -> v128 {
        v128_or(below_plain(flipped(v)), backslashes(v))
    }

    /// `v ^ 2` (see `stop_or_high`).
    fn flipped(v: v128) -> v128 {
        v128_xor(v, u8x16_splat(2))
    }

    /// Flipped bytes that stop a plain run or are past ASCII: below 0x21 rather
    /// than at most 0x20, since V8 has one x64 instruction for a signed less-than
    /// and builds at-most from two.
    fn below_plain(flipped: v128) -> v128 {
        i8x16_lt(flipped, i8x16_splat(0x21))
    }

    fn backslashes(v: v128) -> v128 {
        i8x16_eq(v, u8x16_splat(b'\\'))
    }

    /// Whether any lane of the four is set, as one vector.
    fn any4([a, b, c, d]: [v128; 4]) -> v128 {
        v128_or(v128_or(a, b), v128_or(c, d))
    }

    /// One bit per byte of a block: the high bits of its four vectors.
    fn mask64(v: [v128; 4]) -> u64 {
        v.iter()
            .enumerate()
            .fold(0, |m, (i, &x)| m | u64::from(u8x16_bitmask(x)) << (16 * i))
    }

    pub fn plain_run(bytes: &[u8]) -> (usize, bool) {
        // Most strings a body has are short (keys, roles, model names): one vector
        // says where they end.
        if let Some(first) = bytes.first_chunk::<16>() {
            let v = load(first);
            let stops = u8x16_bitmask(stops(v));
            if stops != 0 {
                let before = (1u16 << stops.trailing_zeros()) - 1;
                return (
                    stops.trailing_zeros() as usize,
                    u8x16_bitmask(v) & before == 0,
                );
            }
        }
        // A prompt's strings run for kilobytes: 128 bytes a step with one test while
        // nothing stops them and all is ASCII, then 64 from the pair that failed it;
        // the block with the stop says where from its masks. After a high byte only
        // the stops are looked for.
        let mut n = 0;
        for pair in pairs(bytes) {
            if !quiet(load8(pair)) {
                break;
            }
            n += 128;
        }
        let mut ascii = true;
        for b in blocks(super::rest(bytes, n)) {
            let v = load4(b);
            if ascii && !v128_any_true(any4(v.map(stop_or_high))) {
                n += 64;
                continue;
            }
            let s = v.map(stops);
            if v128_any_true(any4(s)) {
                let at = mask64(s).trailing_zeros();
                let before = (1u64 << at) - 1;
                return (n + at as usize, ascii && mask64(v) & before == 0);
            }
            // No stop: the test caught a high byte.
            ascii = false;
            n += 64;
        }
        let mut high = u16::from(!ascii);
        for c in chunks(super::rest(bytes, n)) {
            let v = load(c);
            let stops = u8x16_bitmask(stops(v));
            if stops != 0 {
                // Only the bytes before the stop count towards ASCII.
                let before = (1u16 << stops.trailing_zeros()) - 1;
                let ascii = high == 0 && u8x16_bitmask(v) & before == 0;
                return (n + stops.trailing_zeros() as usize, ascii);
            }
            high |= u8x16_bitmask(v);
            n += 16;
        }
        let (tail, ascii) = super::portable_plain_run(super::rest(bytes, n));
        (n + tail, ascii && high == 0)
    }

    pub fn common_len(a: &[u8], b: &[u8]) -> usize {
        // 128 bytes a step while they agree (their XOR is all zero), then 64 from
        // the pair that differs, then 16 a step to the difference.
        let mut n = 0;
        for (x, y) in pairs(a).zip(pairs(b)) {
            let (x, y) = (load8(x), load8(y));
            let [d0, d1, d2, d3, d4, d5, d6, d7] =
                [0, 1, 2, 3, 4, 5, 6, 7].map(|i| v128_xor(x[i], y[i]));
            if v128_any_true(v128_or(any4([d0, d1, d2, d3]), any4([d4, d5, d6, d7]))) {
                break;
            }
            n += 128;
        }
        for (x, y) in blocks(super::rest(a, n)).zip(blocks(super::rest(b, n))) {
            let ([x0, x1, x2, x3], [y0, y1, y2, y3]) = (load4(x), load4(y));
            let eq = [
                i8x16_eq(x0, y0),
                i8x16_eq(x1, y1),
                i8x16_eq(x2, y2),
                i8x16_eq(x3, y3),
            ];
            let [e0, e1, e2, e3] = eq;
            if !i8x16_all_true(v128_and(v128_and(e0, e1), v128_and(e2, e3))) {
                return n + mask64(eq).trailing_ones() as usize;
            }
            n += 64;
        }
        for (x, y) in chunks(super::rest(a, n)).zip(chunks(super::rest(b, n))) {
            // One bit per byte, set where they agree: the first clear bit is the
            // first difference.
            let same = u8x16_bitmask(i8x16_eq(load(x), load(y)));
            if same != 0xffff {
                return n + same.trailing_ones() as usize;
            }
            n += 16;
        }
        n + super::portable_common_len(super::rest(a, n), super::rest(b, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_common_length_is_found_at_any_offset() {
        // Past two 128-byte pairs, so a difference falls in every step's lanes.
        let a: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        for len in 0..=a.len() {
            let x = &a[..len];
            assert_eq!(common_len(x, &a), len, "a prefix of the other");
            assert_eq!(common_len(&a, x), len);
            assert_eq!(portable_common_len(x, &a), len);
            for at in 0..len {
                let mut y = x.to_vec();
                y[at] ^= 0x80;
                assert_eq!(common_len(x, &y), at, "differs at {at} of {len}");
                assert_eq!(portable_common_len(x, &y), at);
            }
        }
    }

    #[test]
    fn a_string_stops_at_the_first_quote_backslash_or_control_byte() {
        let plain = "prompt text, café 日本 ".repeat(8);
        assert_eq!(plain_string_len(plain.as_bytes()), plain.len());
        assert_eq!(plain_string_len(b""), 0);
        for stop in [b'"', b'\\', 0x00, 0x0a, 0x1f] {
            for at in 0..plain.len() {
                let mut s = plain.clone().into_bytes();
                s[at] = stop;
                s[plain.len() - 1] = stop;
                assert_eq!(plain_string_len(&s), at, "byte {stop:#x} at {at}");
                assert_eq!(portable_plain_run(&s).0, at);
            }
        }
        assert_eq!(
            plain_string_len(b" !#[]~\x7f"),
            7,
            "0x20 and 0x7f are plain"
        );
    }

    #[test]
    fn a_strings_run_is_text_only_if_it_is_utf8_up_to_the_stop() {
        let ascii = "x".repeat(150);
        for at in 0..ascii.len() {
            // ASCII up to the stop, anything after it.
            let mut s = ascii.clone().into_bytes();
            s[at] = b'"';
            s.push(0xff);
            let (n, text) = plain_string_text(&s);
            assert_eq!((n, text), (at, Some(&ascii[..at])), "stop at {at}");
            // A high byte before the stop: checked in full.
            if at > 0 {
                let mut cut = s.clone();
                cut[at - 1] = 0xc3;
                assert_eq!(
                    plain_string_text(&cut),
                    (at, None),
                    "a cut char before {at}"
                );
            }
        }
        let accented = "café 日本 ".repeat(5);
        let mut s = accented.clone().into_bytes();
        s.push(b'\\');
        assert_eq!(
            plain_string_text(&s),
            (accented.len(), Some(accented.as_str()))
        );
    }

    #[test]
    fn every_byte_value_stops_a_run_or_not_as_the_portable_scan_says() {
        // Each value at each lane of the pairs, the blocks, the 16-byte steps and
        // the tail.
        for value in 0..=255u8 {
            for at in (0..300).step_by(7) {
                let mut s = b"y".repeat(300);
                s[at] = value;
                assert_eq!(
                    plain_run(&s),
                    portable_plain_run(&s),
                    "byte {value:#x} at {at}"
                );
            }
        }
    }

    #[test]
    fn a_high_byte_before_the_stop_makes_the_run_not_ascii_in_any_block() {
        // A high byte in an earlier block than the stop, in the same one, or after
        // it; and two stops, the first one counting.
        for high in (0..260).step_by(5) {
            for stop in (0..260).step_by(3) {
                let mut s = b"z".repeat(260);
                s[high] = 0xe9;
                s[stop] = b'"';
                s[259] = b'\\';
                assert_eq!(
                    plain_run(&s),
                    portable_plain_run(&s),
                    "high byte at {high}, stop at {stop}"
                );
            }
        }
    }

    #[test]
    fn ascii_is_seen_in_every_block_chunk_and_the_tail() {
        // Lengths with and without whole 64-byte blocks, 16-byte chunks after them
        // and a tail after those.
        for len in [0, 5, 16, 40, 64, 70, 100, 128, 150, 200] {
            let text = b"x".repeat(len);
            assert!(is_ascii(&text), "{len}");
            for at in 0..len {
                let mut t = text.clone();
                t[at] = 0xc3;
                assert!(!is_ascii(&t), "a high byte at {at} of {len}");
            }
        }
    }

    #[test]
    fn text_is_utf8_checked_whether_or_not_it_is_ascii() {
        assert_eq!(utf8(b"plain prompt"), Some("plain prompt"));
        let accented = "café au lait, 日本語 and 🦀 ".repeat(3);
        assert_eq!(utf8(accented.as_bytes()), Some(accented.as_str()));
        let cut = &accented.as_bytes()[..accented.len() - 2];
        assert_eq!(utf8(cut), None, "a char cut short");
        let mut stray = b"a".repeat(20);
        stray.push(0xff);
        assert_eq!(utf8(&stray), None, "a byte that starts no char");
    }
}
