//! The VM's allocator: the system allocator (dlmalloc in wasm32) with the small
//! blocks a request frees kept aside, by size class, for the next request's.
//!
//! A routed request allocates about fifteen times, nearly all of it small: its
//! stream, the model's and the worker's names, a record and its `Rc`, list
//! headers. In Envoy each of those cost about 200 V8 instructions between
//! dlmalloc's bins and its free (`benches/envoy-profile`: 3k a request for
//! `cache_aware`, 4k for `predicted_ttft`), where taking a block off a list and
//! putting it back is a few loads and stores (measured: 1.1k fewer Envoy
//! instructions a request for `cache_aware`, 1.8k-2.5k for `predicted_ttft`).
//!
//! Only blocks up to 512 bytes are kept, and a bounded number of each size
//! (`KEPT_PER_CLASS`, about 170 KiB in all): a prompt's kilobytes and the tree's
//! long edges stay dlmalloc's alone. A kept size is rounded up to its class, which
//! the tree's small nodes pay too: in `benches/soak` (40k requests, a 4M-char
//! budget) a VM held 6.6 MiB for 3.97M chars, 1.73 bytes a char, where dlmalloc
//! alone held 1.7 (talc, a whole allocator in its place, held 2.2).

use std::alloc::{GlobalAlloc, Layout};
use std::ptr;

/// Blocks up to `FINE_LARGEST` bytes come in classes `FINE_STEP` apart (names,
/// `Rc`s, list headers), larger ones up to `LARGEST` in classes `COARSE_STEP`
/// apart (a stream's state, a decision's lists).
const FINE_STEP: usize = 16;
const FINE_LARGEST: usize = 128;
const COARSE_STEP: usize = 64;
/// The largest block kept.
const LARGEST: usize = 512;
const FINE_CLASSES: usize = FINE_LARGEST / FINE_STEP;
const CLASSES: usize = FINE_CLASSES + (LARGEST - FINE_LARGEST) / COARSE_STEP;
/// The alignment every kept block has (dlmalloc's own on wasm32: a larger one
/// takes its slower aligned path). A layout asking more is never kept.
const BLOCK_ALIGN: usize = 8;
/// Freed blocks kept per class, beyond which they go back to the system: at most
/// about 170 KiB kept in all.
const KEPT_PER_CLASS: usize = 64;

/// The class of a layout whose blocks are kept (`None`: the system's alone).
fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size();
    if layout.align() > BLOCK_ALIGN || size > LARGEST {
        None
    } else if size <= FINE_LARGEST {
        Some(size.saturating_sub(1) / FINE_STEP)
    } else {
        Some(FINE_CLASSES + (size - FINE_LARGEST - 1) / COARSE_STEP)
    }
}

/// The layout a class's blocks are allocated with from the system.
fn block_layout(class: usize) -> Option<Layout> {
    let size = if class < FINE_CLASSES {
        (class + 1) * FINE_STEP
    } else {
        FINE_LARGEST + (class + 1 - FINE_CLASSES) * COARSE_STEP
    };
    Layout::from_size_align(size, BLOCK_ALIGN).ok()
}

/// One class's freed blocks: a list threaded through the blocks themselves (each
/// holds the next one's address in its first bytes), and its length.
#[derive(Clone, Copy)]
struct List {
    head: *mut u8,
    kept: usize,
}

/// Freed small blocks, a list per class.
pub struct FreeLists {
    lists: [List; CLASSES],
}

impl Default for FreeLists {
    fn default() -> Self {
        FreeLists::new()
    }
}

impl FreeLists {
    pub const fn new() -> FreeLists {
        FreeLists {
            lists: [List {
                head: ptr::null_mut(),
                kept: 0,
            }; CLASSES],
        }
    }

    /// How many freed blocks the lists hold.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.lists.iter().map(|l| l.kept).sum()
    }

    /// A block for `layout` from `system`: a kept one of its class if any.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`; `system` must be the allocator every block these
    /// lists hold came from.
    pub unsafe fn alloc(&mut self, system: &impl GlobalAlloc, layout: Layout) -> *mut u8 {
        let Some(class) = class_of(layout) else {
            return system.alloc(layout);
        };
        let Some(list) = self.lists.get_mut(class) else {
            return ptr::null_mut();
        };
        if list.head.is_null() {
            return block_layout(class).map_or(ptr::null_mut(), |l| system.alloc(l));
        }
        let block = list.head;
        // SAFETY: a kept block is at least 16 bytes, aligned to 8, and holds the
        // next block's address (`dealloc` wrote it).
        list.head = block.cast::<*mut u8>().read();
        list.kept -= 1;
        block
    }

    /// `alloc`, zeroed: a large block by the system, which knows the memory it
    /// grows by is zero already.
    ///
    /// # Safety
    /// As `alloc`.
    pub unsafe fn alloc_zeroed(&mut self, system: &impl GlobalAlloc, layout: Layout) -> *mut u8 {
        if class_of(layout).is_none() {
            return system.alloc_zeroed(layout);
        }
        let block = self.alloc(system, layout);
        if !block.is_null() {
            // SAFETY: the block is at least `layout.size()` bytes.
            block.write_bytes(0, layout.size());
        }
        block
    }

    /// Gives back `block`, allocated by `alloc` for `layout`: kept while its
    /// class has room, else the system's again.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`, with `block` from this `alloc` over `system`.
    pub unsafe fn dealloc(&mut self, system: &impl GlobalAlloc, block: *mut u8, layout: Layout) {
        let Some(class) = class_of(layout) else {
            return system.dealloc(block, layout);
        };
        let Some(list) = self.lists.get_mut(class) else {
            return;
        };
        if list.kept >= KEPT_PER_CLASS {
            if let Some(l) = block_layout(class) {
                system.dealloc(block, l);
            }
            return;
        }
        // SAFETY: the block is the caller's to give up, at least 16 bytes and
        // aligned to 8 (its class's layout): room for the list's link.
        block.cast::<*mut u8>().write(list.head);
        list.head = block;
        list.kept += 1;
    }

    /// `block` (allocated for `layout`) resized to `new_size`: in place within
    /// its class, by the system between two large sizes, else moved.
    ///
    /// # Safety
    /// As `GlobalAlloc::realloc`, with `block` from this `alloc` over `system`.
    pub unsafe fn realloc(
        &mut self,
        system: &impl GlobalAlloc,
        block: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        match (class_of(layout), class_of(new_layout)) {
            (Some(old), Some(new)) if old == new => block,
            (None, None) => system.realloc(block, layout, new_size),
            _ => {
                let moved = self.alloc(system, new_layout);
                if !moved.is_null() {
                    // SAFETY: both blocks are at least the smaller size, and
                    // distinct (`block` is still allocated).
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    self.dealloc(system, block, layout);
                }
                moved
            }
        }
    }
}

/// `FreeLists` over the system allocator as the VM's global allocator. A wasm32
/// VM without threads runs one call at a time, so the lists need no lock.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
mod global {
    use super::FreeLists;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::UnsafeCell;

    pub struct SmallBlocks(UnsafeCell<FreeLists>);

    // SAFETY: wasm32 without the atomics feature has one thread: no two calls
    // ever reach the lists at once.
    unsafe impl Sync for SmallBlocks {}

    #[global_allocator]
    static ALLOCATOR: SmallBlocks = SmallBlocks(UnsafeCell::new(FreeLists::new()));

    // SAFETY: every block comes from `System` (directly, or kept by the lists
    // after it came from there) and goes back through the lists, which hand a
    // block to one owner at a time.
    unsafe impl GlobalAlloc for SmallBlocks {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            (*self.0.get()).alloc(&System, layout)
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            (*self.0.get()).alloc_zeroed(&System, layout)
        }

        unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
            (*self.0.get()).dealloc(&System, block, layout)
        }

        unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            (*self.0.get()).realloc(&System, block, layout, new_size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;
    use std::cell::Cell;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The system allocator, counting what it is asked for.
    #[derive(Default)]
    struct Counting {
        allocs: Cell<usize>,
        frees: Cell<usize>,
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            self.allocs.set(self.allocs.get() + 1);
            System.alloc(layout)
        }
        unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
            self.frees.set(self.frees.get() + 1);
            System.dealloc(block, layout)
        }
    }

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_cover_small_blocks_of_the_vms_alignment_only() {
        assert_eq!(class_of(layout(1, 1)), Some(0));
        assert_eq!(class_of(layout(16, 8)), Some(0));
        assert_eq!(class_of(layout(17, 4)), Some(1));
        assert_eq!(class_of(layout(128, 8)), Some(7));
        assert_eq!(class_of(layout(129, 1)), Some(8));
        assert_eq!(class_of(layout(192, 1)), Some(8));
        assert_eq!(class_of(layout(193, 1)), Some(9));
        assert_eq!(class_of(layout(512, 8)), Some(CLASSES - 1));
        assert_eq!(class_of(layout(513, 1)), None);
        assert_eq!(class_of(layout(8, 16)), None);
        // Every size fits its class's block, and the block is the class's own.
        for size in 1..=LARGEST {
            let class = class_of(layout(size, 1)).unwrap();
            let block = block_layout(class).unwrap().size();
            assert!(block >= size, "{size} in a block of {block}");
            assert_eq!(class_of(layout(block, 1)), Some(class));
        }
    }

    #[test]
    fn a_freed_small_block_is_the_next_one_of_its_class() {
        let system = Counting::default();
        let mut lists = FreeLists::new();
        unsafe {
            let a = lists.alloc(&system, layout(24, 8));
            a.write_bytes(0xAB, 24);
            lists.dealloc(&system, a, layout(24, 8));
            assert_eq!(lists.kept(), 1);
            // Another size of the same class (17..=32 bytes) takes it back.
            let b = lists.alloc(&system, layout(30, 4));
            assert_eq!(b, a);
            assert_eq!(lists.kept(), 0);
            // Another class does not.
            let c = lists.alloc(&system, layout(40, 8));
            assert_ne!(c, a);
            assert_eq!(system.allocs.get(), 2);
            lists.dealloc(&system, b, layout(30, 4));
            lists.dealloc(&system, c, layout(40, 8));
            assert_eq!(system.frees.get(), 0);
            assert_eq!(lists.kept(), 2);
        }
    }

    #[test]
    fn a_zeroed_block_is_zero_even_when_it_was_kept() {
        let system = Counting::default();
        let mut lists = FreeLists::new();
        unsafe {
            for l in [layout(48, 8), layout(2000, 8)] {
                let a = lists.alloc(&system, l);
                a.write_bytes(0xFF, l.size());
                lists.dealloc(&system, a, l);
                let b = lists.alloc_zeroed(&system, l);
                assert!(!b.is_null());
                assert!((0..l.size()).all(|i| b.add(i).read() == 0), "{l:?}");
                lists.dealloc(&system, b, l);
            }
        }
    }

    #[test]
    fn large_and_overaligned_blocks_are_the_systems_alone() {
        let system = Counting::default();
        let mut lists = FreeLists::new();
        unsafe {
            for l in [layout(4096, 8), layout(513, 1), layout(16, 64)] {
                let p = lists.alloc(&system, l);
                assert!(!p.is_null());
                assert_eq!(p as usize % l.align(), 0);
                lists.dealloc(&system, p, l);
            }
        }
        assert_eq!((system.allocs.get(), system.frees.get()), (3, 3));
        assert_eq!(lists.kept(), 0);
    }

    #[test]
    fn each_class_keeps_a_bounded_number_and_returns_the_rest() {
        let system = Counting::default();
        let mut lists = FreeLists::new();
        let n = KEPT_PER_CLASS + 10;
        unsafe {
            let blocks: Vec<*mut u8> = (0..n)
                .map(|_| lists.alloc(&system, layout(100, 8)))
                .collect();
            for &b in &blocks {
                lists.dealloc(&system, b, layout(100, 8));
            }
            assert_eq!(lists.kept(), KEPT_PER_CLASS);
            assert_eq!(system.frees.get(), 10);
            // Every kept block is distinct and comes back once each.
            let again: std::collections::HashSet<usize> = (0..KEPT_PER_CLASS)
                .map(|_| lists.alloc(&system, layout(100, 8)) as usize)
                .collect();
            assert_eq!(again.len(), KEPT_PER_CLASS);
            assert_eq!(system.allocs.get(), n);
            for b in again {
                System.dealloc(b as *mut u8, block_layout(6).unwrap());
            }
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_across_classes_and_sizes() {
        let system = Counting::default();
        let mut lists = FreeLists::new();
        unsafe {
            let mut l = layout(5, 1);
            let mut p = lists.alloc(&system, l);
            for i in 0..5 {
                p.add(i).write(i as u8);
            }
            // Within the class: the same block.
            let q = lists.realloc(&system, p, l, 12);
            assert_eq!(q, p);
            l = layout(12, 1);
            for i in 5..12 {
                q.add(i).write(i as u8);
            }
            p = q;
            // Growing through the classes into the system's sizes, and back.
            for size in [40, 128, 129, 500, 513, 5000, 300, 64, 12] {
                let q = lists.realloc(&system, p, l, size);
                assert!(!q.is_null());
                let kept = l.size().min(size).min(12);
                for i in 0..kept {
                    assert_eq!(q.add(i).read(), i as u8, "byte {i} at size {size}");
                }
                p = q;
                l = layout(size, 1);
            }
            lists.dealloc(&system, p, l);
        }
    }
}
