//! How a router applies the operation stream every VM shares: its own decisions'
//! records from where their walk ended, another VM's operations from the bytes the
//! ring holds, evictions and membership at the same point in every VM.

use super::Router;
use crate::config::Pool;
use crate::request::model_trees::{Bounds, Inserted};
use crate::shared::{Incoming, Op};
use crate::tree::{TenantId, Walked};

impl Router {
    /// Applies operation `seq` of the stream (its clock is `seq + 1`, so 0 never
    /// appears). Operations naming unknown workers are ignored.
    pub fn apply<S: AsRef<str>>(&mut self, seq: u64, op: &Op<S>) {
        self.apply_walked(seq, op, None);
    }

    /// `apply` for the record of this VM's last decision: its insert starts where
    /// the decision's walk of the text ended (`crate::tree::Tree::insert_walked`,
    /// which checks that the walk is that tree's and still holds).
    pub fn apply_routed(&mut self, seq: u64, op: &Op) {
        let walked = self.walked.take();
        self.apply_walked(seq, op, walked);
    }

    fn apply_walked<S: AsRef<str>>(&mut self, seq: u64, op: &Op<S>, walked: Option<Walked>) {
        let clock = seq.saturating_add(1);
        self.clock = self.clock.max(clock);
        match op {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } => {
                if let Some(idx) = self.worker_index(*pool, worker.as_ref()) {
                    let text = Inserted::Routed(text.as_ref(), walked);
                    self.insert((*pool, model.as_ref()), text, idx, clock);
                }
            }
            Op::Forget {
                pool,
                model,
                worker,
                text,
                keep_chars,
                seq,
            } => {
                if let Some(idx) = self.worker_index(*pool, worker.as_ref()) {
                    let keep = usize::try_from(*keep_chars).unwrap_or(usize::MAX);
                    self.trees.forget(
                        (*pool, model.as_ref()),
                        text.as_ref(),
                        idx,
                        keep,
                        seq.saturating_add(1),
                    );
                }
            }
            Op::Evict => self.evict(),
            Op::Membership(m) => {
                self.set_membership(m);
            }
        }
    }

    /// `apply` of operation `seq` as the ring holds it (`Incoming`), an insert's
    /// text checked as UTF-8 only past what the tree holds of it. `false`: not an
    /// operation, or an insert whose text is not UTF-8; nothing was applied.
    pub fn apply_encoded(&mut self, seq: u64, bytes: &[u8]) -> bool {
        match Incoming::decode(bytes) {
            Some(Incoming::Insert {
                pool,
                model,
                worker,
                text,
            }) => {
                let clock = seq.saturating_add(1);
                let inserted = match self.worker_index(pool, worker) {
                    Some(idx) => self.insert((pool, model), Inserted::Replayed(text), idx, clock),
                    None => true,
                };
                if inserted {
                    self.clock = self.clock.max(clock);
                }
                inserted
            }
            Some(Incoming::Other(op)) => {
                self.apply(seq, &op);
                true
            }
            None => false,
        }
    }

    /// Applies `op` as the next operation of this VM alone (no sharing).
    pub fn apply_local(&mut self, op: &Op) {
        self.apply(self.clock, op);
    }

    fn insert(
        &mut self,
        key: (Pool, &str),
        text: Inserted<'_>,
        worker: TenantId,
        clock: u64,
    ) -> bool {
        let workers = &self.cfg.workers;
        let declared = |m: &str| workers.iter().any(|w| w.models.iter().any(|d| d == m));
        let bounds = Bounds {
            max_models: self.cfg.max_models,
            max_total_chars: self.cfg.max_total_tree_chars,
            declared: &declared,
        };
        self.trees.insert(key, text, worker, clock, &bounds)
    }

    /// Periodic eviction (SMG's `eviction_interval`): every tenant down to
    /// `max_tree_size`, then all trees down to the VM budget.
    pub fn evict(&mut self) {
        self.trees
            .evict(self.cfg.max_tree_size, self.cfg.max_total_tree_chars);
    }
}
