//! The VM state every stream and the root context of one VM share: the router, this
//! VM's handles on the shared tables and its place in the operation ring, the
//! tie-break generator and the stats.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use proxy_wasm::types::LogLevel;

use super::host::{self, HostStore};
use super::metrics::{Metrics, ReplicaMetrics};
use crate::config::Config;
use crate::load::{LoadTable, Loads};
use crate::relay::Part;
use crate::request::kv_bounds::Share;
use crate::request::router::Router;
use crate::rng::SplitMix64;
use crate::shared::{
    owner_expiry_ms, read_loads, BellWatch, ByWorker, CostTable, Flushed, InflightTable,
    IntervalClaim, Keys, MembershipTable, Op, OpRing, Outbox, OwnAtSample, Recorded, SamplesTable,
    TableCache,
};

/// The "gate configured but blind" warning fires once per this many requests.
const GATE_INERT_LOG_SAMPLE: u64 = 64;

/// This VM's handles on the state all VMs share.
pub struct SharedState {
    pub keys: Keys,
    pub ring: OpRing,
    /// What this VM recorded since its last sync, and when that was.
    pub outbox: Outbox,
    /// In-flight counts, with `predicted_ttft`'s outstanding prefill.
    pub inflight: InflightTable,
    pub eviction: IntervalClaim,
    /// One VM per interval turns the engines' samples into KV bounds.
    pub kv_bounds: IntervalClaim,
    pub samples: SamplesTable,
    /// `predicted_ttft`: learned costs, in-flight at sample time.
    pub costs: CostTable,
    pub own_at_sample: OwnAtSample,
    /// Discovery mode's worker list.
    pub membership: MembershipTable,
    /// This VM's copy of the tables few requests change (`crate::shared::generation`).
    pub tables: TableCache,
    /// Their bell as this VM last heard it (sync windows only).
    pub bell: BellWatch,
    /// The next ring sequence this VM has not applied.
    pub cursor: u64,
    /// The host's clock as last read (by `State::loads` or the tick): a count's
    /// release is stamped with it, which costs no hostcall.
    pub recent_ms: Cell<u64>,
}

/// Everything the streams of this VM share.
pub struct State {
    pub router: Router,
    pub shared: SharedState,
    pub rng: SplitMix64,
    pub metrics: Metrics,
    pub replica_metrics: ReplicaMetrics,
    /// Requests routed with the gate blind, for the sampled warning.
    gate_inert_seen: u64,
    /// Whether this root context has had a stream (`serve`). Envoy configures the
    /// plugin on its main thread too, and every listener's plugin config is a root
    /// context of its own on every thread; those that never see a request kept a
    /// full copy of the tree by catching up on every tick: every routed text copied
    /// out of shared data and inserted once more per such copy.
    serving: bool,
    /// `route_in: one_vm`: this root context's part (`super::relay`).
    pub relay: Part,
    /// The last request's tables by worker index, for the next to write into
    /// (`recycle`): allocating and zeroing them for each request showed at 256
    /// workers.
    spare: Cell<ByWorker>,
}

/// The VM state, absent until the first configuration is accepted.
pub type Shared = Rc<RefCell<Option<State>>>;

impl State {
    /// A new VM (or one reloaded after a failure) takes the ring from whatever it
    /// still holds, and catches up with it.
    pub fn new(cfg: Config, keys: Keys, ring: OpRing) -> State {
        let head = ring.head(&HostStore).unwrap_or(0);
        let cursor = head.saturating_sub(ring.slots() as u64);
        let seed = cfg.rng_seed.unwrap_or_else(host::random_seed);
        let metrics = Metrics::define(&cfg);
        // This VM instance's id in the tables it owns counts in (0 is the readers').
        let vm = host::random_seed().max(1);
        let expiry = owner_expiry_ms(cfg.tick_ms());
        let outbox = Outbox::new(cfg.sync_batch_ms);
        let mut state = State {
            router: Router::new(cfg),
            shared: SharedState {
                ring,
                outbox,
                inflight: InflightTable::new(vm, expiry),
                eviction: IntervalClaim::eviction(&keys),
                kv_bounds: IntervalClaim::kv_bounds(&keys),
                samples: SamplesTable::new(&keys),
                costs: CostTable::new(&keys),
                own_at_sample: OwnAtSample::new(&keys),
                membership: MembershipTable::new(&keys),
                tables: TableCache::default(),
                bell: BellWatch::default(),
                keys,
                cursor,
                recent_ms: Cell::new(host::now_ms()),
            },
            rng: SplitMix64(seed),
            metrics,
            replica_metrics: ReplicaMetrics::define(),
            gate_inert_seen: 0,
            serving: false,
            relay: Part::default(),
            spare: Cell::default(),
        };
        state.refresh_membership();
        state
    }

    /// Whether this VM holds no request of its own: the routing VM's holds of the
    /// decisions it made for other VMs are theirs (its counters go to the host as a
    /// quiet VM's do, at once).
    pub fn holds_no_stream(&self) -> bool {
        let inflight = &self.shared.inflight;
        match &self.relay {
            Part::Router { holds, .. } if !holds.is_empty() => {
                let held: u64 = inflight.mine().iter().map(|(_, n)| n).sum();
                held <= holds.len() as u64
            }
            _ => inflight.holds_nothing(),
        }
    }

    /// Whether this root context keeps the tree (`serving`).
    pub fn serving(&self) -> bool {
        self.serving
    }

    /// A stream arrived: from now on this root context keeps the tree, starting
    /// from the operations the ring still holds (as a new VM does); the stream's own
    /// routing catches up with them.
    pub fn serve(&mut self) {
        // A VM that asks the routing VM keeps no tree.
        if self.serving || self.relay.asks() {
            return;
        }
        self.serving = true;
        // Nothing was applied here: all the ring still holds is to apply.
        if let Some(head) = self.shared.ring.head(&HostStore) {
            self.shared.cursor = head.saturating_sub(self.shared.ring.slots() as u64);
        }
    }

    /// Takes a new configuration; a resized ring is a new stream, read from its head.
    pub fn reconfigure(&mut self, cfg: Config, ring: OpRing) {
        if self.shared.ring.slots() != ring.slots() {
            self.shared.cursor = ring.head(&HostStore).unwrap_or(0);
            self.shared.ring = ring;
        }
        let expiry = owner_expiry_ms(cfg.tick_ms());
        self.shared.inflight.set_expiry(expiry);
        self.shared.outbox.set_window(cfg.sync_batch_ms);
        self.router.reconfigure(cfg);
        self.shared.tables.clear();
        self.refresh_membership();
        self.metrics.reconfigure(self.router.config());
    }

    /// Discovery mode: takes the stored worker list if it is newer than this VM's.
    /// The ring carries every change in order; this covers a VM that starts, fell
    /// more than a ring behind, or missed a change whose append failed (the tick
    /// calls it, one read per interval).
    pub fn refresh_membership(&mut self) {
        if !self.router.config().discovers() {
            return;
        }
        let version = self.router.membership_version();
        let (m, _) = self.shared.membership.read(&HostStore);
        self.router.set_membership(&m);
        self.follow_membership(version);
    }

    /// What a request routes by: every thread's in-flight counts, the collector's
    /// samples and the overload flags, read once, at the time the caller last read
    /// the clock (`recent_ms`).
    pub fn loads(&self) -> Loads {
        let now = self.shared.recent_ms.get();
        let s = &self.shared;
        let cfg = self.router.config();
        read_loads(
            &HostStore,
            &s.keys,
            (cfg, self.router.names()),
            now,
            (&s.inflight, &s.ring, &s.costs),
            (&s.tables, s.ring.generation()),
            self.spare.take(),
        )
    }

    /// Keeps a request's loads' tables for the next request (`loads`).
    pub fn recycle(&self, loads: Loads) {
        self.spare.set(ByWorker::reclaim(loads));
    }

    /// The collector's last snapshot, for this config's workers.
    pub fn engine_loads(&self) -> LoadTable {
        self.shared
            .samples
            .read(&HostStore, &self.router.config().workers)
    }

    /// Counts a request routed with the gate set but no fresh sample anywhere, and
    /// warns on 1 in 64: the condition is steady, so sampling exposes it without
    /// flooding the log.
    pub fn note_gate_inert(&mut self) {
        self.metrics.gate_inert.inc();
        if self.gate_inert_seen.is_multiple_of(GATE_INERT_LOG_SAMPLE) {
            host::log(
                LogLevel::Warn,
                "llm-router: worker_queue_limit is set but no worker has a fresh engine sample, \
                 so the queue gate is inert: check that the collector pushes to the stats endpoint",
            );
        }
        self.gate_inert_seen += 1;
    }

    /// Applies what other VMs recorded since the last call. The clock that times a
    /// slot not yet written is the last one read (a request's or a tick's): no
    /// hostcall of its own for a wait counted in seconds.
    pub fn catch_up(&mut self) {
        if !self.serving {
            // No tree to apply to (a VM that asks the routing VM): the head's read
            // alone, for the in-flight counts that ride on it.
            if let Some(head) = self.shared.ring.head(&HostStore) {
                self.shared.cursor = head;
                self.shared.outbox.passed(head);
            }
            return;
        }
        let version = self.router.membership_version();
        let router = &mut self.router;
        let now = self.shared.recent_ms.get();
        let s = &mut self.shared;
        let outbox = &s.outbox;
        // This VM's own batches were applied when they were recorded.
        let mine = |seq| outbox.applied_ahead(seq);
        let got = s
            .ring
            .catch_up_past(&HostStore, &mut s.cursor, now, mine, |seq, op| {
                router.apply_encoded(seq, op)
            });
        s.outbox.passed(s.cursor);
        if got.applied > 0 {
            self.metrics.sync_applied.add(got.applied);
        }
        if got.gaps > 0 {
            self.metrics.sync_gaps.add(got.gaps);
            self.refresh_membership();
        }
        self.follow_membership(version);
    }

    /// Per-worker stats follow a worker list that changed since `version`, and the
    /// change is logged (once per VM: operators see when each thread switched).
    fn follow_membership(&mut self, version: u64) {
        let now = self.router.membership_version();
        if now == version {
            return;
        }
        // The cached tables are by worker index.
        self.shared.tables.clear();
        let cfg = self.router.config();
        self.metrics.reconfigure(cfg);
        let names = |routable: bool| {
            cfg.workers
                .iter()
                .filter(|w| w.routable() == routable)
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
        };
        host::log(
            LogLevel::Info,
            &format!(
                "llm-router: discovered workers (version {now}): {:?}, leaving {:?}",
                names(true),
                names(false)
            ),
        );
    }

    /// Whether this VM syncs with the others now (`crate::shared::Outbox`), by the
    /// clock as last read.
    pub fn sync_due(&self) -> bool {
        self.shared.outbox.due(self.shared.recent_ms.get())
    }

    /// What a request sees of the others: as of now if it syncs; else as of this
    /// VM's last sync, but with the tables a stats push, a flag or a health change
    /// rewrote since (their bell: one read that copies nothing into the VM).
    pub fn sync_or_listen(&mut self) {
        if self.sync_due() {
            self.catch_up();
        }
        let s = &self.shared;
        if s.outbox.windowed() && s.bell.moved(&HostStore, &s.keys) {
            s.tables.clear();
            // A push rang it, and may have brought a new worker list: the routing
            // VM of `route_in: one_vm` decides every thread's requests by it.
            if self.relay.routes_for_others() {
                self.refresh_membership();
            }
        }
    }

    /// Records a request's tree operation, shared at this VM's next sync and
    /// applied here at once, ahead of its ring place (`crate::shared::Outbox`).
    pub fn record(&mut self, op: &Op) -> Rc<Recorded> {
        let applied_at = self.serving.then_some(self.shared.cursor);
        if let Some(seq) = applied_at {
            self.router.apply_routed(seq, op);
        }
        self.shared.outbox.push(op, applied_at)
    }

    /// Records an operation every VM applies at the same point of the ring
    /// (eviction, a new worker list) and shares it at once, after whatever waits.
    pub fn record_now(&mut self, op: &Op) {
        if !self.shared.outbox.is_empty() {
            self.flush();
        }
        self.shared.outbox.push(op, None);
        match self.flush() {
            Flushed::Shared { seq, .. } if self.serving && seq == self.shared.cursor => {
                let version = self.router.membership_version();
                self.router.apply(seq, op);
                self.shared.cursor = seq.saturating_add(1);
                self.metrics.sync_applied.inc();
                self.follow_membership(version);
            }
            Flushed::Refused { .. } => {
                let version = self.router.membership_version();
                self.router.apply_local(op);
                self.follow_membership(version);
            }
            // Behind other VMs' operations: applied by catching up with them.
            Flushed::Shared { .. } if self.serving => self.catch_up(),
            // No tree here (a VM that asks the routing VM), but a worker list it
            // took is its own at once.
            Flushed::Shared { .. } if matches!(op, Op::Membership(_)) => {
                let version = self.router.membership_version();
                self.router.apply_local(op);
                self.follow_membership(version);
            }
            _ => {}
        }
    }

    /// Turns the engines' fresh samples into KV bounds (`crate::request::kv_bounds`)
    /// and shares those that changed, each applied by every VM at its place in the
    /// stream. Run by one VM per interval, caught up with the stream: the chars it
    /// counted since each worker's last bound are the stream's.
    pub fn share_kv_bounds(&mut self) {
        let table = self.engine_loads();
        let now = self.shared.recent_ms.get();
        let stale_after = self.router.config().stale_after_ms;
        let steps: Vec<_> = (0..self.router.config().workers.len())
            .filter_map(|i| {
                let s = table.fresh(i, now, stale_after)?;
                self.router
                    .kv_step(i, s.kv_capacity_tokens, s.prompt_tokens_total, now)
            })
            .collect();
        for (op, why) in steps {
            self.metrics.kv_bounds_shared.inc();
            if why == Share::Restarted {
                self.metrics.engine_restarts.inc();
            }
            self.record_now(&op);
        }
    }

    /// The end of a stream: what waits is shared once the window has passed, or
    /// once this VM holds no request (then nothing may come to share it until the
    /// tick).
    pub fn settle(&mut self) {
        if !self.shared.outbox.is_empty()
            && (self.shared.inflight.holds_nothing() || self.sync_due())
        {
            self.flush();
        }
    }

    /// Shares what this VM recorded since its last sync as one batch, this VM's
    /// counts riding on the claim (nothing recorded: the counts alone, if they
    /// changed). What this VM applied ahead is not applied again; when other VMs
    /// appended first, their operations are applied now. What it did.
    pub fn flush(&mut self) -> Flushed {
        let now = self.shared.recent_ms.get();
        let s = &mut self.shared;
        let flushed = s
            .outbox
            .flush(&HostStore, &s.ring, &s.inflight.rider(now), now);
        match flushed {
            Flushed::Nothing => {
                s.inflight.flush(&HostStore, &s.ring, now);
            }
            // Shared for every VM; a root context without streams keeps no tree.
            Flushed::Shared { .. } if !self.serving => {}
            Flushed::Shared { seq, ops, ahead } if seq == self.shared.cursor => {
                if ahead {
                    self.shared.cursor = seq.saturating_add(1);
                    self.shared.outbox.passed(self.shared.cursor);
                    self.metrics.sync_applied.add(ops as u64);
                }
            }
            // Other VMs appended first: their operations come before the batch.
            Flushed::Shared { ahead: true, .. } => self.catch_up(),
            // `record_now` applies its operation in ring order.
            Flushed::Shared { .. } => {}
            Flushed::Refused { error, ops } => {
                self.metrics.sync_append_failures.add(ops as u64);
                host::log(
                    LogLevel::Warn,
                    &format!("llm-router: tree operations kept on this thread only: {error:?}"),
                );
            }
        }
        flushed
    }
}
