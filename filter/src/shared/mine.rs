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

/// One worker's counts this VM holds.
#[derive(Debug, Clone)]
pub(super) struct Held<const N: usize> {
    pub(super) name: String,
    pub(super) values: [u64; N],
    /// Its index in the worker list it was last looked up in (`WorkerNames::id`,
    /// index): every request sums this VM's counts by index, and looking up each
    /// name again was most of what the in-flight table cost with dozens busy.
    pub(super) index: Cell<Option<(u64, usize)>>,
    /// Where its entry is in `Mine::row`: the first byte and the length.
    at: (usize, usize),
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

/// What this VM holds, found by name without a scan (with dozens of workers busy,
/// comparing names along the list for each of a request's four changes was most of
/// what the bookkeeping cost), and its row's entries.
#[derive(Debug, Default)]
pub(super) struct Mine<const N: usize> {
    pub(super) held: Vec<Held<N>>,
    /// The entries of this VM's row (`super::owned`'s encoding), one per held
    /// worker, in no particular order.
    pub(super) row: Vec<u8>,
    /// An entry's bytes as a change encodes them (kept: a change must not allocate).
    scratch: Vec<u8>,
    /// Each held worker's position in `held`, hashed by its name (the name is not
    /// copied: a busy fleet takes a new worker on most requests).
    at: hashbrown::HashTable<usize>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl<const N: usize> Mine<N> {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
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
        let held = &self.held;
        let found = self
            .at
            .find(hash, |&i| held.get(i).is_some_and(|h| h.name == worker))
            .copied();
        let pos = match found {
            Some(pos) => pos,
            None => {
                let pos = self.held.len();
                self.held.push(Held {
                    name: worker.to_string(),
                    values: [0; N],
                    index: Cell::new(None),
                    at: (self.row.len(), 0),
                });
                let (held, hasher) = (&self.held, &self.hasher);
                self.at.insert_unique(hash, pos, |&i| {
                    held.get(i).map_or(0, |h| hasher.hash_one(h.name.as_str()))
                });
                pos
            }
        };
        let held = self.held.get_mut(pos)?;
        let index = names.and_then(|names| held.index_in(names));
        let before = held.values;
        for (v, d) in held.values.iter_mut().zip(delta) {
            *v = v.saturating_add_signed(d);
        }
        let after = held.values;
        if after.iter().all(|x| *x == 0) {
            self.remove(pos, hash);
        } else {
            self.encode_entry(pos);
        }
        index.map(|index| Change {
            index,
            before,
            after,
        })
    }

    /// Puts the entry of the worker at `pos` in the row as its values now are: a new
    /// one at the end, else its values in place (the name before them stays).
    fn encode_entry(&mut self, pos: usize) {
        let Some(held) = self.held.get(pos) else {
            return;
        };
        let (start, len) = held.at;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let from = if len == 0 {
            put_varint(&mut scratch, held.name.len() as u64);
            scratch.extend_from_slice(held.name.as_bytes());
            start
        } else {
            start + varint_len(held.name.len() as u64) + held.name.len()
        };
        for v in &held.values {
            put_varint(&mut scratch, *v);
        }
        let to = (start + len).min(self.row.len());
        let from = from.min(to);
        let new_len = len.saturating_sub(to - from) + scratch.len();
        match self.row.get_mut(from..to) {
            Some(slot) if slot.len() == scratch.len() => slot.copy_from_slice(&scratch),
            _ => {
                // An entry at the end (a new one, mostly) moves no other.
                let last = to == self.row.len();
                self.row.splice(from..to, scratch.iter().copied());
                if !last {
                    self.moved_after(start, len, new_len);
                }
                if let Some(held) = self.held.get_mut(pos) {
                    held.at = (start, new_len);
                }
            }
        }
        self.scratch = scratch;
    }

    /// The entries after the one at `start` move as it goes from `len` bytes to
    /// `new_len`.
    fn moved_after(&mut self, start: usize, len: usize, new_len: usize) {
        for h in &mut self.held {
            if h.at.0 > start {
                h.at.0 = h.at.0.saturating_sub(len) + new_len;
            }
        }
    }

    /// Drops the worker at `pos` (its name hashing to `hash`) and its entry; the
    /// last takes its place.
    fn remove(&mut self, pos: usize, hash: u64) {
        let Some(&Held {
            at: (start, len), ..
        }) = self.held.get(pos)
        else {
            return;
        };
        let end = (start + len).min(self.row.len());
        self.row.drain(start.min(end)..end);
        self.moved_after(start, len, 0);
        if let Ok(entry) = self.at.find_entry(hash, |&i| i == pos) {
            entry.remove();
        }
        let last = self.held.len() - 1;
        if pos != last {
            let moved = self.held.get(last).map(|h| self.hash(&h.name));
            if let Some(slot) = moved.and_then(|h| self.at.find_mut(h, |&i| i == last)) {
                *slot = pos;
            }
        }
        self.held.swap_remove(pos);
    }
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
            let mut held: Vec<(String, [u64; 2])> = mine
                .held
                .iter()
                .map(|h| (h.name.clone(), h.values))
                .collect();
            held.sort();
            assert_eq!(entries(&mine.row), held, "step {step}");
            assert!(held.iter().all(|(_, v)| *v != [0, 0]), "step {step}");
        }
    }
}
