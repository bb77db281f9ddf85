//! Running slots with a FIFO wait queue, like an engine's max-num-seqs.
//!
//! The router reads `num_requests_waiting` / `num_requests_running` to steer load, so the mock
//! has to report them truthfully, including when clients give up. Both counters are maintained
//! by RAII guards: a request that is cancelled while waiting or while running (its future is
//! dropped) gives its place back, so slots can never leak.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Default)]
struct Counters {
    waiting: AtomicUsize,
    running: AtomicUsize,
}

/// The slot limiter. Cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct Slots {
    /// `None` = unlimited. Tokio's semaphore is fair, which gives FIFO admission.
    sem: Option<Arc<Semaphore>>,
    counters: Arc<Counters>,
}

/// A running slot; dropping it frees the slot and decrements `running`.
#[derive(Debug)]
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    counters: Arc<Counters>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counters.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a request as waiting for as long as it lives.
struct Waiting<'a>(&'a Counters);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    /// A limiter for `max_running` concurrent requests; 0 means unlimited.
    pub fn new(max_running: usize) -> Self {
        Self {
            sem: (max_running > 0).then(|| Arc::new(Semaphore::new(max_running))),
            counters: Arc::default(),
        }
    }

    /// Waits (FIFO) for a free slot. Cancel-safe: dropping the future leaves the queue.
    pub async fn acquire(&self) -> Slot {
        self.counters.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(&self.counters);
        let permit = match &self.sem {
            // The semaphore is never closed, so acquisition cannot fail; if it somehow did,
            // admitting the request beats wedging it forever.
            Some(sem) => sem.clone().acquire_owned().await.ok(),
            None => None,
        };
        // Count as running before leaving the waiting count so the sum never dips.
        self.counters.running.fetch_add(1, Ordering::SeqCst);
        drop(waiting);
        Slot {
            _permit: permit,
            counters: self.counters.clone(),
        }
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.counters.waiting.load(Ordering::SeqCst)
    }

    /// Requests holding a slot.
    pub fn running(&self) -> usize {
        self.counters.running.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn slot_is_released_on_drop_and_queue_is_fifo() {
        let slots = Slots::new(1);
        let first = slots.acquire().await;
        assert_eq!((slots.running(), slots.waiting()), (1, 0));

        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for i in 0..2 {
            let (s, o) = (slots.clone(), order.clone());
            handles.push(tokio::spawn(async move {
                let slot = s.acquire().await;
                o.lock().unwrap().push(i);
                settle().await;
                drop(slot);
            }));
            settle().await;
        }
        assert_eq!((slots.running(), slots.waiting()), (1, 2));
        drop(first);
        for h in handles {
            h.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1]);
        assert_eq!((slots.running(), slots.waiting()), (0, 0));
    }

    #[tokio::test]
    async fn cancelled_waiter_and_cancelled_runner_leak_nothing() {
        let slots = Slots::new(1);
        let held = slots.acquire().await;
        let s = slots.clone();
        let waiter = tokio::spawn(async move { s.acquire().await });
        settle().await;
        assert_eq!(slots.waiting(), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(slots.waiting(), 0);

        // A runner whose task is dropped mid-work frees its slot.
        drop(held);
        let s = slots.clone();
        let runner = tokio::spawn(async move {
            let _slot = s.acquire().await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        settle().await;
        assert_eq!(slots.running(), 1);
        runner.abort();
        let _ = runner.await;
        assert_eq!(slots.running(), 0);
        let again = tokio::time::timeout(Duration::from_secs(1), slots.acquire()).await;
        assert!(again.is_ok(), "slot must be free again");
    }

    #[tokio::test]
    async fn unlimited_never_waits() {
        let slots = Slots::new(0);
        let a = slots.acquire().await;
        let b = slots.acquire().await;
        assert_eq!((slots.running(), slots.waiting()), (2, 0));
        drop((a, b));
        assert_eq!(slots.running(), 0);
    }
}
