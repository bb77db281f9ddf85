//! What a routing decision says about itself: one reason (why this worker) and one
//! label (the decision class counted in metrics). `as_str()` is the one spelling used
//! in logs, metrics and response headers.

use crate::config::Policy;
use crate::tree::TenantId;

/// Declares `Reason` from its list: each reason's doc, variant, spelling and label
/// on one entry, so a new reason is one entry, and `ALL`, `as_str` and `label`
/// cannot miss it. Every policy also has a reason of its own, `Picked`, which comes
/// with its registration line: a policy whose decisions all have one reason needs no
/// entry here.
macro_rules! reasons {
    ($($(#[$doc:meta])* $name:ident = $spelling:literal, $label:ident;)*) => {
        /// Why the worker was chosen.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $name,)*
            /// The policy's own choice, spelled as the policy's name (`round_robin`,
            /// `random`, ...), counted as a miss: the policy did not follow a prefix.
            Picked(Policy),
        }

        /// The reasons of the list, without the policies' own.
        const LISTED: &[Reason] = &[$(Reason::$name),*];

        impl Reason {
            /// Every reason, for per-reason counters: the list's, then every
            /// policy's own in the policies' order.
            pub const ALL: [Reason; LISTED.len() + Policy::ALL.len()] = {
                let mut all = [Reason::Picked(Policy::ALL[0]); LISTED.len() + Policy::ALL.len()];
                let mut i = 0;
                while i < LISTED.len() {
                    all[i] = LISTED[i];
                    i += 1;
                }
                let mut p = 0;
                while p < Policy::ALL.len() {
                    all[LISTED.len() + p] = Reason::Picked(Policy::ALL[p]);
                    p += 1;
                }
                all
            };

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => $spelling,)*
                    Reason::Picked(policy) => policy.as_str(),
                }
            }

            /// The metric class. `all_queued` is deliberately not `cache_hit_*`, so
            /// a query on `cache_hit.*` does not read a saturated fleet as a
            /// healthy one; a fleet that is all overloaded (or all down) is
            /// saturated too.
            pub fn label(self) -> Label {
                match self {
                    $(Reason::$name => Label::$label,)*
                    Reason::Picked(_) => Label::CacheMiss,
                }
            }
        }
    };
}

reasons! {
    /// The prefix owner (match rate above `cache_threshold`).
    CacheHit = "cache_hit", CacheHit;
    /// Match rate at or below the threshold: least in-flight.
    CacheMiss = "cache_miss", CacheMiss;
    /// In-flight loads imbalanced beyond both thresholds: least in-flight, tree
    /// ignored.
    Imbalanced = "imbalanced", CacheMiss;
    /// The body gave no routing text: least in-flight.
    Unreadable = "unreadable_body", CacheMiss;
    /// Every prefix owner was queued at the limit; diverted to a worker that is not.
    CacheWorkerQueued = "cache_worker_queued", CacheWorkerQueued;
    /// Every owner and every worker of the fleet queued: stayed with an owner.
    AllQueued = "all_queued", AllQueued;
    /// Every owner queued and no worker provably below the floor: pinned to an owner.
    SaturationPin = "saturation_pin", AllQueued;
    /// Every candidate was flagged overloaded: routed among them rather than refused.
    AllOverloaded = "all_overloaded", AllQueued;
    /// Every serving worker was down after failures: routed among them rather than
    /// refused (a wrong verdict must not refuse the whole fleet).
    AllDown = "all_down", AllQueued;
    /// `predicted_ttft`: the lowest predicted TTFT is on a worker holding this
    /// request's longest cached prefix (stayed with the cache).
    TtftCache = "ttft_cache", CacheHit;
    /// `predicted_ttft`: a worker holding the longest prefix was eligible, but
    /// another was predicted faster (moved: the queue outweighed the cache).
    TtftSpread = "ttft_spread", CacheMiss;
    /// `predicted_ttft`: every holder of the longest prefix was above the
    /// bounded-load cap.
    TtftCapped = "ttft_capped", CacheMiss;
    /// `predicted_ttft`: no worker holds any of the text: the least predicted work.
    TtftCold = "ttft_cold", CacheMiss;
}

/// Decision classes; exactly one per routed request, so they sum to the routed count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Label {
    CacheHit,
    CacheMiss,
    CacheWorkerQueued,
    AllQueued,
}

impl Label {
    pub const ALL: [Label; 4] = [
        Label::CacheHit,
        Label::CacheMiss,
        Label::CacheWorkerQueued,
        Label::AllQueued,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Label::CacheHit => "cache_hit",
            Label::CacheMiss => "cache_miss",
            Label::CacheWorkerQueued => "cache_worker_queued",
            Label::AllQueued => "all_queued",
        }
    }
}

/// What the queue gate did to a decision's cache candidates, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateAudit {
    /// Owners the gate rejected (fresh sample at or above the limit).
    pub rejected: u32,
    /// Owners admitted only because they had no fresh sample (gate set).
    pub unsampled: u32,
}

/// The chosen worker (an index into the configured workers) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub worker: TenantId,
    pub reason: Reason,
    /// Chars of the routing text the tree matched (0 when it was not consulted); for
    /// `cache_worker_queued`, the prefix the diversion abandoned.
    pub matched_chars: usize,
    pub gate: GateAudit,
    /// `predicted_ttft` only: what the model predicted on the chosen worker.
    pub predicted: Option<Prediction>,
}

/// The chosen worker's predicted time to first token and the uncached prefill
/// this request adds there (the work the router books until its first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prediction {
    /// Predicted time to first token, in microseconds.
    pub ttft_us: u64,
    /// Chars of the routing text the worker does not hold.
    pub uncached_chars: u64,
    /// Uncached prefill chars already outstanding there when it was chosen.
    pub ahead_chars: u64,
}

impl Decision {
    pub fn label(&self) -> Label {
        self.reason.label()
    }
}
