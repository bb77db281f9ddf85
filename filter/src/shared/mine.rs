//! This VM's own share of `super::owned`'s counts, kept in memory (the truth its
//! row publishes): the workers it holds counts on, found by name without a scan,
//! each change as the journal of a kept table records it, and the row's entries
//! kept encoded, each changed in place by its change.
//!
//! Every request's taken count publishes the row (`super::owned`), and at 256
//! workers a busy VM holds counts on dozens of them: encoding every entry at every
//! publication was about 2.5k instructions a request in Envoy, most of it a copy of
//! each name (V8 runs `memory.copy` as a call out of the VM). Kept encoded, a
//! publication copies the entries once, and a change re-encodes its own entry.

use std::cell::Cell;
use std::hash::BuildHasher;

use super::{put_varint, Reader};
use crate::config::WorkerNames;

/// One worker's counts this VM holds, or held: a worker's slot stays when its
/// counts go back to zero (see `Mine`).
#[derive(Debug, Clone)]
pub(super) struct Held<const N: usize> {
    pub(super) name: String,
    pub(super) values: [u64; N],
    /// Its index in the worker list it was last looked up in (`WorkerNames::id`,
    /// index): every request sums this VM's counts by index, and looking up each
    /// name again was most of what the in-flight table cost with dozens busy.
    pub(super) index: Cell<Option<(u64, usize)>>,
    /// Its place in `Mine::live` while its counts are not all zero.
    live: Option<usize>,
}

impl<const N: usize> Held<N> {
    pub(super) fn index_in(&self, names: &WorkerNames) -> Option<usize> {
        match self.index.get() {
            Some((list, i)) if list == names.id() => Some(i),
            _ => {
                let i = names.get(&self.name)?;
                self.index.set(Some((names.id(), i)));
                Some(i)
            }
        }
    }
}

/// Slots of workers whose counts went back to zero kept at most: past it they
/// are dropped (a fleet's membership changed, or one larger than this).
const PARKED_LIMIT: usize = 1024;

/// What this VM holds, found by name without a scan (with dozens of workers busy,
/// comparing names along the list for each of a request's four changes was most of
/// what the bookkeeping cost), and its row's entries.
///
/// A worker keeps its slot when its counts go back to zero. In a large fleet most
/// requests take a worker none of this VM's requests holds, and giving it a slot
/// and dropping it again (its name copied, hashed in and out, looked up in the
/// worker list) was about 0.5k Envoy instructions a request at 256 workers.
#[derive(Debug, Default)]
pub(super) struct Mine<const N: usize> {
    slots: Vec<Held<N>>,
    /// The slots whose counts are not all zero, in no particular order.
    live: Vec<usize>,
    /// Where each of them has its entry in `row`: the first byte and the length,
    /// at the same place as in `live`. Kept apart from the slots so that moving
    /// every entry after one that grew or left is one pass over a few words
    /// (which Wasm SIMD takes four at a time): at 256 workers a VM holds dozens,
    /// and a request moves them twice.
    starts: Vec<usize>,
    lens: Vec<usize>,
    /// The entries of this VM's row (`super::owned`'s encoding), one per live
    /// slot, in no particular order.
    pub(super) row: Vec<u8>,
    /// An entry's bytes as a change encodes them (kept: a change must not allocate).
    scratch: Vec<u8>,
    /// Each slot's position in `slots`, hashed by its name (the name is not
    /// copied to look it up).
    at: hashbrown::HashTable<usize>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl<const N: usize> Mine<N> {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The workers this VM holds counts on (none of them all zero).
    pub(super) fn held(&self) -> impl Iterator<Item = &Held<N>> {
        self.live.iter().filter_map(|&s| self.slots.get(s))
    }

    /// How many workers this VM holds counts on.
    pub(super) fn held_count(&self) -> usize {
        self.live.len()
    }

    pub(super) fn holds_nothing(&self) -> bool {
        self.live.is_empty()
    }

    /// Adds `delta` to `worker`'s counts (saturating at zero); a worker whose
    /// counts are all zero is no longer held. The change, for a worker in `names`:
    /// its index there and its counts before and after.
    pub(super) fn change(
        &mut self,
        worker: &str,
        delta: [i64; N],
        names: Option<&WorkerNames>,
    ) -> Option<Change<N>> {
        let hash = self.hash(worker);
        let slots = &self.slots;
        let found = self
            .at
            .find(hash, |&i| slots.get(i).is_some_and(|h| h.name == worker))
            .copied();
        let pos = match found {
            Some(pos) => pos,
            None => self.slot(worker, hash),
        };
        let held = self.slots.get_mut(pos)?;
        let index = names.and_then(|names| held.index_in(names));
        let before = held.values;
        for (v, d) in held.values.iter_mut().zip(delta) {
            *v = v.saturating_add_signed(d);
        }
        let after = held.values;
        match (after.iter().all(|x| *x == 0), held.live) {
            (true, Some(place)) => self.park(pos, place),
            (true, None) => {}
            (false, live) => {
                let place = live.unwrap_or(self.live.len());
                if live.is_none() {
                    held.live = Some(place);
                    self.live.push(pos);
                    self.starts.push(self.row.len());
                    self.lens.push(0);
                }
                self.encode_entry(place);
            }
        }
        index.map(|index| Change {
            index,
            before,
            after,
        })
    }

    /// A new slot for `worker` (its name hashing to `hash`), its counts zero.
    #[cold]
    #[inline(never)]
    fn slot(&mut self, worker: &str, hash: u64) -> usize {
        if self.slots.len() - self.live.len() >= PARKED_LIMIT {
            self.drop_parked();
        }
        let pos = self.slots.len();
        self.slots.push(Held {
            name: worker.to_string(),
            values: [0; N],
            index: Cell::new(None),
            live: None,
        });
        index_slot(&mut self.at, (&self.slots, &self.hasher), hash, pos);
        pos
    }

    /// Keeps only the live slots (their entries stay where they are in the row,
    /// and their places in `live`).
    #[cold]
    fn drop_parked(&mut self) {
        self.slots = self
            .live
            .iter()
            .filter_map(|&s| self.slots.get(s).cloned())
            .collect();
        self.live = (0..self.slots.len()).collect();
        for (place, held) in self.slots.iter_mut().enumerate() {
            held.live = Some(place);
        }
        self.at.clear();
        for (pos, held) in self.slots.iter().enumerate() {
            let hash = self.hasher.hash_one(held.name.as_str());
            index_slot(&mut self.at, (&self.slots, &self.hasher), hash, pos);
        }
    }

    /// Puts the entry of the worker at `place` in `live` in the row as its values
    /// now are: a new one at the end, else its values in place (the name before
    /// them stays). Values that keep their encoded length (nearly every change: a
    /// count moving by one) are written over the old ones where they are, with no
    /// copy (V8 runs each `memory.copy`, a few bytes here, as a call out of the VM).
    fn encode_entry(&mut self, place: usize) {
        let (Some(held), Some(&start), Some(&len)) = (
            self.live.get(place).and_then(|&s| self.slots.get(s)),
            self.starts.get(place),
            self.lens.get(place),
        ) else {
            return;
        };
        let name_len = held.name.len();
        let from = start + varint_len(name_len as u64) + name_len;
        let to = (start + len).min(self.row.len());
        if len != 0 {
            let values_len: usize = held.values.iter().map(|v| varint_len(*v)).sum();
            if let Some(slot) = self.row.get_mut(from..to).filter(|s| s.len() == values_len) {
                let mut at = 0;
                for v in &held.values {
                    at += write_varint(slot.get_mut(at..).unwrap_or_default(), *v);
                }
                return;
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let from = if len == 0 {
            put_varint(&mut scratch, name_len as u64);
            scratch.extend_from_slice(held.name.as_bytes());
            start
        } else {
            from
        };
        for v in &held.values {
            put_varint(&mut scratch, *v);
        }
        self.resize_entry(place, (start, len), from.min(to)..to, &scratch);
        self.scratch = scratch;
    }

    /// Puts `bytes` in place of `range` of the entry at `place` in `live` (at
    /// `start`, `len` bytes long), whose length changes: a new entry, or a count
    /// whose encoding grew or shrank.
    #[inline(never)]
    fn resize_entry(
        &mut self,
        place: usize,
        (start, len): (usize, usize),
        range: std::ops::Range<usize>,
        bytes: &[u8],
    ) {
        let new_len = len.saturating_sub(range.len()) + bytes.len();
        // An entry at the end (a new one, mostly) moves no other.
        let last = range.end == self.row.len();
        self.row.splice(range, bytes.iter().copied());
        if !last {
            self.moved_after(start, len, new_len);
        }
        if let Some(l) = self.lens.get_mut(place) {
            *l = new_len;
        }
    }

    /// The live entries after the one at `start` move as it goes from `len` bytes
    /// to `new_len`.
    fn moved_after(&mut self, start: usize, len: usize, new_len: usize) {
        // Without a branch, so that it is vectorised: those after it start at
        // least `len` further on.
        for at in &mut self.starts {
            *at = if *at > start {
                at.wrapping_sub(len).wrapping_add(new_len)
            } else {
                *at
            };
        }
    }

    /// The worker at `pos`, at `place` in `live`, holds nothing now: its entry
    /// leaves the row and its slot stays.
    #[inline(never)]
    fn park(&mut self, pos: usize, place: usize) {
        let (Some(held), Some(&start), Some(&len), true) = (
            self.slots.get_mut(pos),
            self.starts.get(place),
            self.lens.get(place),
            place < self.live.len(),
        ) else {
            return;
        };
        held.live = None;
        let end = (start + len).min(self.row.len());
        self.row.drain(start.min(end)..end);
        self.live.swap_remove(place);
        self.starts.swap_remove(place);
        self.lens.swap_remove(place);
        self.moved_after(start, len, 0);
        // The last live slot took its place.
        if let Some(moved) = self.live.get(place).and_then(|&s| self.slots.get_mut(s)) {
            moved.live = Some(place);
        }
    }
}

/// Puts slot `pos` of `slots`, its name hashing to `hash`, in `at` (which, as it
/// grows, rehashes the slots it holds by their names).
fn index_slot<const N: usize>(
    at: &mut hashbrown::HashTable<usize>,
    (slots, hasher): (&[Held<N>], &hashbrown::DefaultHashBuilder),
    hash: u64,
    pos: usize,
) {
    at.insert_unique(hash, pos, |&i| {
        slots.get(i).map_or(0, |h| hasher.hash_one(h.name.as_str()))
    });
}

/// An entry's name and numbers, read after its length (as `Mine::encode_entry`
/// writes them).
pub(super) fn entry<'a, const N: usize>(r: &mut Reader<'a>) -> Option<(&'a str, [u64; N])> {
    let len = usize::try_from(r.varint()?).ok()?;
    let name = crate::scan::utf8(r.take(len)?)?;
    let mut values = [0u64; N];
    for v in &mut values {
        *v = r.varint()?;
    }
    Some((name, values))
}

/// Writes `v` as `put_varint` encodes it at the start of `out`, which must hold
/// `varint_len(v)` bytes (bytes past its end are dropped). The bytes written.
fn write_varint(out: &mut [u8], mut v: u64) -> usize {
    let mut n = 0;
    loop {
        let byte = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
        if let Some(b) = out.get_mut(n) {
            *b = byte;
        }
        n += 1;
        v >>= 7;
        if v == 0 {
            return n;
        }
    }
}

/// Bytes of `v` as a LEB128 varint (`put_varint`).
fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// One change of this VM's counts on the worker at `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<const N: usize> {
    pub index: usize,
    pub before: [u64; N],
    pub after: [u64; N],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, SplitMix64};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The row's entries, decoded and sorted.
    fn entries(row: &[u8]) -> Vec<(String, [u64; 2])> {
        let mut r = Reader(row);
        let mut out = Vec::new();
        while !r.0.is_empty() {
            let (name, values) = entry::<2>(&mut r).expect("an entry");
            out.push((name.to_string(), values));
        }
        out.sort();
        out
    }

    #[test]
    fn a_worker_back_to_zero_keeps_its_slot_and_parked_slots_are_bounded() {
        let names = crate::config::WorkerNames::new(&crate::config::testing::named_workers(3));
        let mut mine = Mine::<2>::default();
        let live = mine.change("w0", [1, 0], None);
        assert_eq!(live, None, "no list, no change to journal");
        mine.change("w1", [1, 5], Some(&names));
        mine.change("w1", [-1, -5], Some(&names));
        assert_eq!(mine.slots.len(), 2, "w1 parked, not dropped");
        assert_eq!(mine.held_count(), 1);
        assert_eq!(entries(&mine.row), vec![("w0".to_string(), [1, 0])]);
        // Taken again: the same slot, its index in the list remembered.
        let again = mine.change("w1", [1, 0], Some(&names));
        assert_eq!(mine.slots.len(), 2);
        assert_eq!(
            again,
            Some(Change {
                index: 1,
                before: [0, 0],
                after: [1, 0]
            })
        );
        assert_eq!(
            entries(&mine.row),
            vec![("w0".to_string(), [1, 0]), ("w1".to_string(), [1, 0])]
        );
        // A release on a parked worker (or one never seen) changes nothing held.
        mine.change("w1", [-1, 0], None);
        mine.change("w1", [-1, 0], None);
        mine.change("never", [-1, 0], None);
        assert_eq!(mine.held_count(), 1);
        // Workers taken and given back one after another, many more than the
        // limit: the parked slots stay bounded, the held ones are found.
        for i in 0..3 * PARKED_LIMIT {
            let worker = format!("x{i}");
            mine.change(&worker, [1, 1], None);
            mine.change(&worker, [-1, -1], None);
        }
        assert!(mine.slots.len() <= PARKED_LIMIT + 1, "{}", mine.slots.len());
        mine.change("w0", [2, 3], None);
        assert_eq!(mine.held_count(), 1);
        assert_eq!(entries(&mine.row), vec![("w0".to_string(), [3, 3])]);
        let held: Vec<&str> = mine.held().map(|h| h.name.as_str()).collect();
        assert_eq!(held, vec!["w0"]);
    }

    #[test]
    fn a_varint_written_in_place_is_the_one_put_at_the_end() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut put = Vec::new();
            put_varint(&mut put, v);
            assert_eq!(varint_len(v), put.len());
            let mut written = vec![0xaa; put.len() + 1];
            assert_eq!(write_varint(&mut written, v), put.len());
            assert_eq!(&written[..put.len()], &put[..], "{v}");
            assert_eq!(written[put.len()], 0xaa, "nothing past it");
        }
    }

    #[test]
    fn the_row_is_the_held_counts_encoded_after_every_change() {
        let mut rng = SplitMix64(11);
        let mut mine = Mine::<2>::default();
        let names = ["w0", "worker-1", "wé", "a-much-longer-worker-name-3", "w4"];
        for step in 0..5000 {
            let worker = names[rng.below(names.len())];
            // Counts and chars that cross varint widths (1 to 3 bytes) both ways.
            let count = rng.below(3) as i64 - 1;
            let chars = match rng.below(4) {
                0 => 0,
                1 => rng.below(100) as i64 - 50,
                2 => rng.below(40_000) as i64 - 20_000,
                _ => -(rng.below(1 << 22) as i64),
            };
            mine.change(worker, [count, chars], None);
            let mut held: Vec<(String, [u64; 2])> =
                mine.held().map(|h| (h.name.clone(), h.values)).collect();
            held.sort();
            assert_eq!(entries(&mine.row), held, "step {step}");
            assert!(held.iter().all(|(_, v)| *v != [0, 0]), "step {step}");
        }
    }
}
