//! This VM's own share of `super::owned`'s counts, kept in memory (the truth its
//! row publishes): the workers it holds counts on, found by name without a scan,
//! and each change as the journal of a kept table records it.

use std::cell::Cell;
use std::hash::BuildHasher;

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

/// What this VM holds, in the order first taken (the order its row lists them),
/// found by name without a scan: with dozens of workers busy, comparing names along
/// the list for each of a request's four changes was most of what the bookkeeping
/// cost.
#[derive(Debug, Default)]
pub(super) struct Mine<const N: usize> {
    pub(super) held: Vec<Held<N>>,
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
        }
        index.map(|index| Change {
            index,
            before,
            after,
        })
    }

    /// Drops the worker at `pos` (its name hashing to `hash`); the last takes its
    /// place.
    fn remove(&mut self, pos: usize, hash: u64) {
        if pos >= self.held.len() {
            return;
        }
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

/// One change of this VM's counts on the worker at `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<const N: usize> {
    pub index: usize,
    pub before: [u64; N],
    pub after: [u64; N],
}
