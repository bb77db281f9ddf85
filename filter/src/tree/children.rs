//! A node's children, by the first char of their edges.
//!
//! A conversation's turn ends at a node, and its next turn goes on below it: most
//! nodes of a chat workload have one child. Each request's new leaf lands under
//! such a node, and a map of its own for that one child cost the request an
//! allocation (and the node the map's memory), and every walk through it a hash. So
//! one child is kept inline, and so are two: a text that leaves an edge midway
//! splits it into a node with two children (the edge's rest and the new leaf),
//! which most requests make, and a map for them cost each an allocation and a
//! rehash. The map is made for the third and given up when two are left.

use super::NodeIdx;
use hashbrown::HashMap;

#[derive(Debug, Clone, Default)]
pub(super) enum Children {
    #[default]
    None,
    One(char, NodeIdx),
    Two([(char, NodeIdx); 2]),
    Many(HashMap<char, NodeIdx>),
}

impl Children {
    pub fn get(&self, first: char) -> Option<NodeIdx> {
        match self {
            Children::None => None,
            Children::One(c, child) => (*c == first).then_some(*child),
            Children::Two([(a, x), (b, y)]) => match first {
                f if f == *a => Some(*x),
                f if f == *b => Some(*y),
                _ => None,
            },
            Children::Many(map) => map.get(&first).copied(),
        }
    }

    /// Sets the child whose edge starts with `first` (replacing one that did).
    pub fn insert(&mut self, first: char, child: NodeIdx) {
        match self {
            Children::None => *self = Children::One(first, child),
            Children::One(c, old) if *c == first => *old = child,
            Children::One(c, old) => *self = Children::Two([(*c, *old), (first, child)]),
            Children::Two(both) => match both.iter_mut().find(|(c, _)| *c == first) {
                Some((_, old)) => *old = child,
                None => {
                    let [x, y] = *both;
                    *self = Children::Many(HashMap::from_iter([x, y, (first, child)]));
                }
            },
            Children::Many(map) => {
                map.insert(first, child);
            }
        }
    }

    pub fn remove(&mut self, first: char) {
        match self {
            Children::One(c, _) if *c == first => *self = Children::None,
            Children::None | Children::One(..) => {}
            Children::Two([x, y]) => {
                let (x, y) = (*x, *y);
                if x.0 == first {
                    *self = Children::One(y.0, y.1);
                } else if y.0 == first {
                    *self = Children::One(x.0, x.1);
                }
            }
            Children::Many(map) => {
                map.remove(&first);
                if map.len() < 3 {
                    let mut left = map.iter().map(|(&c, &child)| (c, child));
                    *self = match (left.next(), left.next()) {
                        (Some(x), Some(y)) => Children::Two([x, y]),
                        (Some((c, child)), None) => Children::One(c, child),
                        _ => Children::None,
                    };
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Children::None)
    }

    /// Every child with its first char, in no particular order (the tree's
    /// invariant checks walk them).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (char, NodeIdx)> {
        let all: Vec<(char, NodeIdx)> = match self {
            Children::None => Vec::new(),
            Children::One(c, child) => vec![(*c, *child)],
            Children::Two(both) => both.to_vec(),
            Children::Many(map) => map.iter().map(|(&c, &child)| (c, child)).collect(),
        };
        all.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sorted(c: &Children) -> Vec<(char, NodeIdx)> {
        let mut all: Vec<_> = c.iter().collect();
        all.sort();
        all
    }

    #[test]
    fn children_go_from_none_to_one_to_a_map_and_back() {
        let mut c = Children::default();
        assert!(c.is_empty());
        assert_eq!((c.get('a'), sorted(&c)), (None, vec![]));
        c.insert('a', 1);
        assert!(matches!(c, Children::One('a', 1)));
        assert_eq!((c.get('a'), c.get('b')), (Some(1), None));
        c.insert('a', 2);
        assert!(matches!(c, Children::One('a', 2)), "replaced in place");
        c.insert('é', 3);
        assert!(matches!(c, Children::Two(_)), "two: inline");
        assert_eq!(sorted(&c), vec![('a', 2), ('é', 3)]);
        assert_eq!(
            (c.get('a'), c.get('é'), c.get('b')),
            (Some(2), Some(3), None)
        );
        c.insert('é', 6);
        assert_eq!(sorted(&c), vec![('a', 2), ('é', 6)], "replaced in place");
        c.insert('z', 4);
        assert!(matches!(c, Children::Many(_)), "the third makes the map");
        c.insert('z', 5);
        assert_eq!(sorted(&c), vec![('a', 2), ('z', 5), ('é', 6)]);
        c.remove('q');
        assert!(matches!(c, Children::Many(_)), "not a child: kept");
        c.remove('a');
        assert!(matches!(c, Children::Two(_)), "two left: inline again");
        assert_eq!(sorted(&c), vec![('z', 5), ('é', 6)]);
        c.remove('q');
        assert_eq!(sorted(&c), vec![('z', 5), ('é', 6)]);
        c.insert('a', 7);
        c.remove('a');
        c.remove('z');
        assert!(matches!(c, Children::One('é', 6)), "one left: inline");
        c.insert('z', 8);
        c.remove('é');
        assert!(matches!(c, Children::One('z', 8)), "either of two may go");
        c.remove('z');
        c.insert('é', 3);
        c.remove('a');
        assert!(matches!(c, Children::One('é', 3)), "not a child: kept");
        c.remove('é');
        assert!(c.is_empty());
        assert_eq!(sorted(&c), vec![]);
    }

    #[test]
    fn every_key_reads_back_as_a_map_would() {
        // The same random inserts and removals on a `Children` and a plain map.
        let mut c = Children::default();
        let mut m: HashMap<char, NodeIdx> = HashMap::new();
        let mut x = 0x9e37_79b9_u32;
        for step in 0..5000u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let key = char::from(b'a' + (x % 5) as u8);
            if x & 0x100 == 0 {
                c.insert(key, step);
                m.insert(key, step);
            } else {
                c.remove(key);
                m.remove(&key);
            }
            let mut want: Vec<_> = m.iter().map(|(&k, &v)| (k, v)).collect();
            want.sort();
            assert_eq!(sorted(&c), want, "step {step}");
            assert_eq!(c.is_empty(), m.is_empty());
            assert!(!matches!(c, Children::Many(ref map) if map.len() < 3));
            for k in ['a', 'b', 'c', 'd', 'e', 'f'] {
                assert_eq!(c.get(k), m.get(&k).copied());
            }
        }
    }
}
