//! Fault injection: make any hostcall (an `env.proxy_*` function or a WASI function)
//! answer a chosen status (or trap the guest) instead of doing its work, at a chosen
//! call count or with a chosen probability.
//!
//! Faults are checked in front of every hostcall by the one registration wrapper
//! (`hostcall::Hostcall`), before the hostcall reads guest memory, so a faulted call has no
//! effect besides its status (no value is returned to the guest). Call counts are per
//! hostcall name over every VM of the host, 1-based, and count every call, faulted or
//! not. Probabilities draw from a generator seeded from the host's seed, so a run with
//! faults is as deterministic as one without.
//!
//! [`envoy_failures`] lists, per hostcall, the statuses Envoy 1.40 itself can answer:
//! the faults a filter meets in production, which it must survive without trapping.

use super::codes::Status;
use super::rng::Rng;
use std::collections::BTreeMap;

/// When a [`Fault`] fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// On the n-th call (1-based) only.
    Nth(u64),
    /// On every call from the n-th (1-based) on.
    From(u64),
    /// On each call with this probability (0..=1).
    Probability(f64),
}

/// What a faulted hostcall does instead of its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Returns this value: a proxy-wasm [`Status`] code, or a WASI errno.
    Status(i32),
    /// Traps the guest, as a crash inside the VM would (to exercise failure policies).
    Trap,
}

/// One injected fault: `hostcall` gives `answer` when `trigger` says so.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// The import's name, e.g. `proxy_get_shared_data` or `random_get`.
    pub hostcall: String,
    /// What the call does instead.
    pub answer: Answer,
    /// When it fires.
    pub trigger: Trigger,
}

impl Fault {
    /// `hostcall` answers `status` on every call.
    pub fn new(hostcall: &str, status: Status) -> Self {
        Self::errno(hostcall, status.code())
    }

    /// A WASI function answers `errno` on every call.
    pub fn errno(hostcall: &str, errno: i32) -> Self {
        Self {
            hostcall: hostcall.into(),
            answer: Answer::Status(errno),
            trigger: Trigger::From(1),
        }
    }

    /// `hostcall` traps the guest on every call.
    pub fn trap(hostcall: &str) -> Self {
        Self {
            answer: Answer::Trap,
            ..Self::errno(hostcall, 0)
        }
    }

    /// Only on the n-th call (1-based).
    pub fn on_call(mut self, n: u64) -> Self {
        self.trigger = Trigger::Nth(n);
        self
    }

    /// On every call from the n-th (1-based).
    pub fn from_call(mut self, n: u64) -> Self {
        self.trigger = Trigger::From(n);
        self
    }

    /// On each call with probability `p`.
    pub fn with_probability(mut self, p: f64) -> Self {
        self.trigger = Trigger::Probability(p);
        self
    }
}

/// A uniform draw in `[0, 1)` from 53 random bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The faults of one host and the call counts they fire on (part of the shared state).
pub(crate) struct Faults {
    pub rules: Vec<Fault>,
    pub calls: BTreeMap<&'static str, u64>,
    pub fired: u64,
    pub rng: Rng,
}

impl Faults {
    pub fn new(seed: u64) -> Self {
        Self {
            rules: Vec::new(),
            calls: BTreeMap::new(),
            fired: 0,
            rng: Rng::new(seed ^ 0xFA01_7FA0_17FA_017F),
        }
    }

    /// Counts a call of `name` and returns the injected answer, if a fault fires.
    pub fn check(&mut self, name: &'static str) -> Option<Answer> {
        let n = self.calls.entry(name).or_insert(0);
        *n += 1;
        let n = *n;
        let rng = &mut self.rng;
        let code = self.rules.iter().find_map(|f| {
            let fires = f.hostcall == name
                && match f.trigger {
                    Trigger::Nth(k) => n == k,
                    Trigger::From(k) => n >= k,
                    Trigger::Probability(p) => unit(rng.next_u64()) < p,
                };
            fires.then_some(f.answer)
        });
        self.fired += code.is_some() as u64;
        code
    }
}

/// The statuses other than `Ok` that Envoy 1.40 (proxy-wasm-cpp-host) can answer for a
/// hostcall in some state of the stream or the plugin; empty for calls that cannot fail.
pub fn envoy_failures(hostcall: &str) -> &'static [Status] {
    use Status::*;
    match hostcall {
        "proxy_get_shared_data" => &[NotFound],
        "proxy_set_shared_data" => &[CasMismatch],
        "proxy_get_header_map_value" => &[NotFound],
        "proxy_get_buffer_bytes" => &[NotFound, BadArgument],
        "proxy_get_property" => &[NotFound],
        "proxy_register_shared_queue" | "proxy_resolve_shared_queue" => &[NotFound],
        "proxy_enqueue_shared_queue" => &[NotFound],
        "proxy_dequeue_shared_queue" => &[NotFound, Empty],
        "proxy_http_call" => &[BadArgument, InternalFailure],
        "proxy_call_foreign_function" => &[NotFound, BadArgument],
        "proxy_increment_metric" => &[NotFound, BadArgument],
        "proxy_record_metric" | "proxy_get_metric" => &[NotFound],
        "proxy_set_effective_context" => &[BadArgument],
        "proxy_replace_header_map_value"
        | "proxy_remove_header_map_value"
        | "proxy_add_header_map_value" => &[BadArgument],
        "proxy_send_local_response" => &[BadArgument],
        "proxy_define_metric" => &[BadArgument],
        "proxy_log" => &[BadArgument],
        "proxy_set_tick_period_milliseconds" => &[BadArgument],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_count_calls_per_hostcall() {
        let mut f = Faults::new(1);
        f.rules.push(Fault::new("a", Status::NotFound).on_call(2));
        f.rules
            .push(Fault::new("b", Status::BadArgument).from_call(2));
        let a: Vec<_> = (0..3).map(|_| f.check("a")).collect();
        let b: Vec<_> = (0..3).map(|_| f.check("b")).collect();
        let (nf, bad) = (Answer::Status(1), Answer::Status(2));
        assert_eq!(a, [None, Some(nf), None]);
        assert_eq!(b, [None, Some(bad), Some(bad)]);
        assert_eq!(f.check("c"), None);
        assert_eq!(f.fired, 3);
    }

    #[test]
    fn probability_fires_about_that_often() {
        let mut f = Faults::new(7);
        f.rules
            .push(Fault::new("a", Status::InternalFailure).with_probability(0.25));
        let fired = (0..4000).filter(|_| f.check("a").is_some()).count();
        assert!((800..1200).contains(&fired), "{fired} of 4000 at p=0.25");
        let mut never = Faults::new(7);
        never
            .rules
            .push(Fault::new("a", Status::InternalFailure).with_probability(0.0));
        assert!((0..100).all(|_| never.check("a").is_none()));
    }
}
