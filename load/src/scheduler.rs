//! Dispatch order and concurrency, independent of HTTP so it can be tested with a fake
//! sender: [`Dispatch`] is the order (also driven in virtual time by `host-sim
//! replay`), [`run_scheduled`] runs it on tokio with the concurrency cap.
//!
//! Rules: at most `concurrency` requests in flight; requests of one session go strictly
//! in file order, each only after the previous one of that session completed (a user
//! waits for the answer before the next turn, and the next turn's prefix is meant to hit
//! the cache the previous turn filled); requests without a session are independent.
//! Among dispatchable requests the earliest in the file goes first.

#[cfg(feature = "net")]
use crate::arrivals::Arrivals;
use std::collections::{BTreeSet, HashMap, VecDeque};
#[cfg(feature = "net")]
use std::future::Future;
#[cfg(feature = "net")]
use std::sync::Arc;
#[cfg(feature = "net")]
use tokio::task::JoinSet;

/// Which request may go next under the session rules: the earliest dispatchable line.
#[derive(Debug, Clone)]
pub struct Dispatch {
    /// Session of each request.
    sessions: Vec<Option<String>>,
    /// Per-session queue of pending indices, in file order. The head of an idle
    /// session's queue is in `ready`; the rest wait until the one before them completes.
    queues: HashMap<String, VecDeque<usize>>,
    /// Dispatchable indices, ordered so the earliest line goes first.
    ready: BTreeSet<usize>,
}

impl Dispatch {
    /// The order for requests whose sessions are `sessions[i]`.
    pub fn new(sessions: &[Option<String>]) -> Self {
        let mut queues: HashMap<String, VecDeque<usize>> = HashMap::new();
        let mut ready = BTreeSet::new();
        for (i, session) in sessions.iter().enumerate() {
            match session {
                None => {
                    ready.insert(i);
                }
                Some(s) => {
                    let queue = queues.entry(s.clone()).or_default();
                    if queue.is_empty() {
                        ready.insert(i);
                    }
                    queue.push_back(i);
                }
            }
        }
        Self {
            sessions: sessions.to_vec(),
            queues,
            ready,
        }
    }

    /// Whether a request may go now.
    pub fn has_next(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The next request to send, if one may go now.
    pub fn take_next(&mut self) -> Option<usize> {
        self.ready.pop_first()
    }

    /// Request `i` completed: the next turn of its session may go.
    pub fn complete(&mut self, i: usize) {
        let Some(Some(s)) = self.sessions.get(i) else {
            return;
        };
        if let Some(queue) = self.queues.get_mut(s.as_str()) {
            // The completed request is the head of its session's queue.
            queue.pop_front();
            if let Some(&next) = queue.front() {
                self.ready.insert(next);
            }
        }
    }
}

/// Runs `send(i)` for every index `i` of `sessions` under the rules above and returns
/// the results in index order. `sessions[i]` is the session of request `i`.
///
/// With `arrivals`, a request may also only go once an arrival has happened (the
/// first at time 0): arrivals that find nothing dispatchable are kept, so a backlog
/// drains as soon as sessions free up, as users who arrived would still be waiting.
#[cfg(feature = "net")]
pub async fn run_scheduled<R, F, Fut>(
    sessions: &[Option<String>],
    concurrency: usize,
    mut arrivals: Option<Arrivals>,
    send: F,
) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let concurrency = concurrency.max(1);
    let send = Arc::new(send);
    let mut order = Dispatch::new(sessions);
    let mut results: Vec<Option<R>> = (0..sessions.len()).map(|_| None).collect();
    let mut in_flight: JoinSet<(usize, R)> = JoinSet::new();
    // Arrivals not yet used, and when the next one comes (closed loop: always one).
    let mut arrived: usize = usize::from(arrivals.is_none());
    let mut next_arrival = tokio::time::Instant::now();
    loop {
        if let Some(a) = arrivals.as_mut() {
            let now = tokio::time::Instant::now();
            while next_arrival <= now {
                arrived += 1;
                next_arrival += a.next_gap();
            }
        }
        while in_flight.len() < concurrency && arrived > 0 {
            let Some(i) = order.take_next() else { break };
            if arrivals.is_some() {
                arrived -= 1;
            }
            let send = Arc::clone(&send);
            in_flight.spawn(async move { (i, send(i).await) });
        }
        let may_send = arrivals.is_some() && in_flight.len() < concurrency && order.has_next();
        if in_flight.is_empty() && !may_send {
            break;
        }
        let joined = tokio::select! {
            joined = in_flight.join_next(), if !in_flight.is_empty() => joined,
            _ = tokio::time::sleep_until(next_arrival), if may_send => continue,
        };
        let Some(joined) = joined else { break };
        let (i, result) = match joined {
            Ok(done) => done,
            // A panicking sender is a bug in this tool, not a network condition.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("request task cancelled unexpectedly: {e}"),
        };
        if let Some(slot) = results.get_mut(i) {
            *slot = Some(result);
        }
        order.complete(i);
    }
    results
        .into_iter()
        .map(|r| r.expect("scheduler dispatches every request exactly once"))
        .collect()
}

#[cfg(all(test, feature = "net"))]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[derive(Default)]
    struct Trace {
        events: Vec<(usize, bool)>, // (index, started?)
        in_flight: usize,
        max_in_flight: usize,
    }

    /// Runs the scheduler with a fake sender that sleeps a per-index time and records
    /// start/end events.
    async fn run_fake(sessions: &[Option<String>], c: usize, delay_ms: fn(usize) -> u64) -> Trace {
        let trace = Arc::new(Mutex::new(Trace::default()));
        let t = Arc::clone(&trace);
        let out = run_scheduled(sessions, c, None, move |i| {
            let t = Arc::clone(&t);
            async move {
                {
                    let mut g = t.lock().unwrap();
                    g.events.push((i, true));
                    g.in_flight += 1;
                    g.max_in_flight = g.max_in_flight.max(g.in_flight);
                }
                tokio::time::sleep(Duration::from_millis(delay_ms(i))).await;
                let mut g = t.lock().unwrap();
                g.events.push((i, false));
                g.in_flight -= 1;
                i * 10
            }
        })
        .await;
        assert_eq!(out, (0..sessions.len()).map(|i| i * 10).collect::<Vec<_>>());
        Arc::try_unwrap(trace).ok().unwrap().into_inner().unwrap()
    }

    fn sessions(spec: &[Option<&str>]) -> Vec<Option<String>> {
        spec.iter().map(|s| s.map(str::to_string)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn same_session_never_overlaps_and_keeps_order() {
        let s = sessions(&[
            Some("a"),
            Some("b"),
            Some("a"),
            None,
            Some("b"),
            Some("a"),
            None,
            Some("c"),
            Some("a"),
        ]);
        // Vary delays so completions reorder.
        let trace = run_fake(&s, 4, |i| [30, 5, 10, 1, 40, 2, 3, 7, 1][i]).await;
        for name in ["a", "b", "c"] {
            let idx: Vec<usize> = (0..s.len())
                .filter(|&i| s[i].as_deref() == Some(name))
                .collect();
            let mut active: Option<usize> = None;
            let mut started = Vec::new();
            for &(i, start) in &trace.events {
                if !idx.contains(&i) {
                    continue;
                }
                if start {
                    assert!(
                        active.is_none(),
                        "session {name}: {i} started while {active:?} in flight"
                    );
                    active = Some(i);
                    started.push(i);
                } else {
                    assert_eq!(active, Some(i));
                    active = None;
                }
            }
            assert_eq!(started, idx, "session {name} order");
        }
        assert!(trace.max_in_flight <= 4);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_cap_is_respected_and_reached() {
        let s = vec![None; 20];
        let trace = run_fake(&s, 3, |_| 10).await;
        assert_eq!(trace.max_in_flight, 3);
        // Independent requests start in file order.
        let starts: Vec<usize> = trace.events.iter().filter(|e| e.1).map(|e| e.0).collect();
        assert_eq!(starts, (0..20).collect::<Vec<_>>());

        let trace = run_fake(&s, 1, |_| 1).await;
        assert_eq!(trace.max_in_flight, 1);
    }

    /// Start offsets (ms from the run's start) of each request, with a sender that
    /// takes `hold` per request.
    async fn start_times(
        sessions: &[Option<String>],
        c: usize,
        arrivals: Arrivals,
        hold: Duration,
    ) -> Vec<u128> {
        let t0 = tokio::time::Instant::now();
        run_scheduled(sessions, c, Some(arrivals), move |_| async move {
            let started = t0.elapsed().as_millis();
            tokio::time::sleep(hold).await;
            started
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn requests_go_at_the_poisson_arrival_times() {
        let s = vec![None; 40];
        let starts = start_times(&s, 64, Arrivals::poisson(10.0, 3), Duration::ZERO).await;
        let mut gaps = Arrivals::poisson(10.0, 3);
        let mut at = Duration::ZERO;
        let expected: Vec<u128> = (0..40)
            .map(|_| {
                let now = at.as_millis();
                at += gaps.next_gap();
                now
            })
            .collect();
        // Tokio's timer fires on the millisecond after a deadline.
        for (i, (got, want)) in starts.iter().zip(&expected).enumerate() {
            assert!(
                (*want..=*want + 1).contains(got),
                "request {i} at {got} ms, its arrival at {want} ms"
            );
        }
        assert!(
            (2_000..8_000).contains(&expected[39]),
            "40 arrivals at 10/s span about 4 s: {}",
            expected[39]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn arrivals_that_find_the_cap_or_a_busy_session_wait_in_order() {
        // One session: each turn waits for the previous (1 s), however fast users arrive.
        let one = vec![Some("a".to_string()); 5];
        let starts = start_times(
            &one,
            8,
            Arrivals::poisson(1000.0, 1),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(starts, vec![0, 1000, 2000, 3000, 4000]);
        // Independent requests, cap 2: the backlog drains two at a time.
        let free = vec![None; 6];
        let starts = start_times(
            &free,
            2,
            Arrivals::poisson(1000.0, 1),
            Duration::from_secs(1),
        )
        .await;
        for (i, s) in starts.iter().enumerate() {
            let round = (i as u128 / 2) * 1000;
            assert!(
                (round..round + 50).contains(s),
                "request {i} starts at {s} ms, in round {round}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn earliest_idle_line_goes_first() {
        // c=2: 0(a) and 1(a) cannot overlap, so 0 and 2 start first, then 1 after 0.
        let s = sessions(&[Some("a"), Some("a"), None, None]);
        let trace = run_fake(&s, 2, |i| [10, 10, 100, 100][i]).await;
        let starts: Vec<usize> = trace.events.iter().filter(|e| e.1).map(|e| e.0).collect();
        assert_eq!(starts, vec![0, 2, 1, 3]);
    }

    #[tokio::test]
    async fn empty_workload() {
        let out: Vec<u8> = run_scheduled(&[], 4, None, |_| async { 0u8 }).await;
        assert!(out.is_empty());
    }
}

#[cfg(test)]
mod dispatch_tests {
    use super::Dispatch;

    #[test]
    fn sessions_go_in_turn_order_and_the_earliest_line_first() {
        let s = |v: &str| Some(v.to_string());
        let mut d = Dispatch::new(&[s("a"), s("b"), s("a"), None, s("b")]);
        assert_eq!(d.take_next(), Some(0));
        assert_eq!(d.take_next(), Some(1));
        assert_eq!(
            d.take_next(),
            Some(3),
            "2 waits for 0, its session's previous turn"
        );
        assert_eq!(d.take_next(), None);
        d.complete(1);
        d.complete(0);
        assert_eq!(
            d.take_next(),
            Some(2),
            "earliest line first once both are ready"
        );
        assert_eq!(d.take_next(), Some(4));
        assert_eq!(d.take_next(), None);
    }
}
