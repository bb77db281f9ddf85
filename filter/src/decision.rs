//! What a routing decision says about itself: one reason (why this worker) and one
//! label (the decision class counted in metrics). `as_str()` is the one spelling used
//! in logs, metrics and response headers.

use crate::tree::TenantId;

/// Why the worker was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The prefix owner (match rate above `cache_threshold`).
    CacheHit,
    /// Match rate at or below the threshold: least in-flight.
    CacheMiss,
    /// In-flight loads imbalanced beyond both thresholds: least in-flight, tree
    /// ignored.
    Imbalanced,
    /// The body gave no routing text: least in-flight.
    Unreadable,
    RoundRobin,
    Random,
    PowerOfTwo,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::CacheHit => "cache_hit",
            Reason::CacheMiss => "cache_miss",
            Reason::Imbalanced => "imbalanced",
            Reason::Unreadable => "unreadable_body",
            Reason::RoundRobin => "round_robin",
            Reason::Random => "random",
            Reason::PowerOfTwo => "power_of_two",
        }
    }

    /// The metric class. Deliberately not `cache_hit_*` for anything but a real
    /// hit, so hit-rate queries do not absorb load-driven choices.
    pub fn label(self) -> Label {
        match self {
            Reason::CacheHit => Label::CacheHit,
            _ => Label::CacheMiss,
        }
    }
}

/// Decision classes; exactly one per routed request, so they sum to the routed count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Label {
    CacheHit,
    CacheMiss,
}

impl Label {
    pub const ALL: [Label; 2] = [Label::CacheHit, Label::CacheMiss];

    pub fn as_str(self) -> &'static str {
        match self {
            Label::CacheHit => "cache_hit",
            Label::CacheMiss => "cache_miss",
        }
    }
}

/// The chosen worker (an index into the configured workers) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub worker: TenantId,
    pub reason: Reason,
    /// Chars of the routing text the tree matched (0 when it was not consulted).
    pub matched_chars: usize,
}

impl Decision {
    pub fn label(&self) -> Label {
        self.reason.label()
    }
}
