//! A node's tenants, sorted by id, the first kept in the node itself. Nearly
//! every request makes a node held by one tenant (the new leaf of its text, and
//! the node a split cuts off above the leaf it landed in), and a vector allocated
//! a block for that one hold and freed it again at eviction: about 0.2k of V8's
//! instructions a request. A node that gains a second tenant moves to a vector
//! and keeps it.

use std::ops::{Deref, DerefMut};

use super::Hold;

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) enum Tenants {
    #[default]
    None,
    One(Hold),
    Many(Vec<Hold>),
}

impl Tenants {
    /// Puts `hold` at `at` (past the end: last), shifting those after it.
    pub(super) fn insert(&mut self, at: usize, hold: Hold) {
        match self {
            Tenants::None => *self = Tenants::One(hold),
            Tenants::One(first) => {
                let first = *first;
                *self = Tenants::Many(if at == 0 {
                    vec![hold, first]
                } else {
                    vec![first, hold]
                });
            }
            Tenants::Many(v) => v.insert(at.min(v.len()), hold),
        }
    }

    /// Removes the hold at `pos` (none there: nothing).
    pub(super) fn remove(&mut self, pos: usize) {
        match self {
            Tenants::One(_) if pos == 0 => *self = Tenants::None,
            Tenants::Many(v) if pos < v.len() => {
                v.remove(pos);
            }
            _ => {}
        }
    }

    /// Keeps the holds `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Hold) -> bool) {
        match self {
            Tenants::None => {}
            Tenants::One(h) => {
                if !keep(h) {
                    *self = Tenants::None;
                }
            }
            Tenants::Many(v) => v.retain(keep),
        }
    }
}

impl Deref for Tenants {
    type Target = [Hold];

    fn deref(&self) -> &[Hold] {
        match self {
            Tenants::None => &[],
            Tenants::One(h) => std::slice::from_ref(h),
            Tenants::Many(v) => v,
        }
    }
}

impl DerefMut for Tenants {
    fn deref_mut(&mut self) -> &mut [Hold] {
        match self {
            Tenants::None => &mut [],
            Tenants::One(h) => std::slice::from_mut(h),
            Tenants::Many(v) => v,
        }
    }
}

impl FromIterator<Hold> for Tenants {
    fn from_iter<I: IntoIterator<Item = Hold>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return Tenants::None;
        };
        match iter.next() {
            None => Tenants::One(first),
            Some(second) => Tenants::Many([first, second].into_iter().chain(iter).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn hold(tenant: u32) -> Hold {
        Hold {
            tenant,
            children: tenant,
            clock: u64::from(tenant) * 10,
        }
    }

    fn ids(t: &Tenants) -> Vec<u32> {
        t.iter().map(|h| h.tenant).collect()
    }

    #[test]
    fn every_edit_reads_as_a_vectors_and_one_hold_stays_inline() {
        // Random inserts, removals and retains against a plain vector.
        let mut state = 7u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let (mut t, mut v) = (Tenants::default(), Vec::<Hold>::new());
        for step in 0..5000 {
            match next(5) {
                0 | 1 => {
                    let at = next(v.len() as u64 + 2) as usize;
                    let h = hold(step);
                    t.insert(at, h);
                    v.insert(at.min(v.len()), h);
                }
                2 | 3 => {
                    let pos = next(v.len() as u64 + 1) as usize;
                    t.remove(pos);
                    if pos < v.len() {
                        v.remove(pos);
                    }
                }
                _ => {
                    let odd = next(2) == 1;
                    t.retain(|h| (h.tenant % 2 == 1) == odd);
                    v.retain(|h| (h.tenant % 2 == 1) == odd);
                }
            }
            assert_eq!(&t[..], &v[..], "step {step}");
            if let Some(h) = t.first_mut() {
                h.clock += 1;
                v[0].clock += 1;
            }
            if matches!(t, Tenants::None | Tenants::One(_)) {
                assert!(v.len() <= 1);
            }
        }
        // A node's first tenant costs no block; a second moves them to one.
        let mut t = Tenants::default();
        t.insert(0, hold(3));
        assert!(matches!(t, Tenants::One(_)));
        t.insert(0, hold(1));
        assert_eq!(ids(&t), [1, 3]);
        t.insert(5, hold(4));
        assert_eq!(ids(&t), [1, 3, 4]);
    }

    #[test]
    fn collected_holds_take_the_form_their_count_needs() {
        let none: Tenants = std::iter::empty().collect();
        assert_eq!(none, Tenants::None);
        let one: Tenants = [hold(2)].into_iter().collect();
        assert_eq!(one, Tenants::One(hold(2)));
        let many: Tenants = (0..3).map(hold).collect();
        assert_eq!(ids(&many), [0, 1, 2]);
        assert!(matches!(many, Tenants::Many(_)));
    }
}
