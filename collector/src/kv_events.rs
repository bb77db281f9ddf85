//! Follows each `--kv-events` engine's KV event stream: a ZMQ SUB socket on its
//! publisher, every message decoded (`llm_kv_events`) and applied to the engine's
//! block index (`crate::kv_index`), a lost stretch asked again from its replay socket
//! with a deadline, and the index's state in the collector's own metrics.
//!
//! A publisher that is not there yet, or goes away, costs nothing but a reconnect:
//! ZMQ reconnects by itself, and a restarted engine is seen by its sequence going
//! back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use llm_kv_events::{decode_message, decode_replay_reply, replay_request, Message, ReplayReply};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::cli::KvSource;
use crate::kv_index::{Arrival, KvIndex, Trust};
use crate::telemetry::{EngineLabel, KvGapLabels, Telemetry};

/// How long a replay may take: past it the gap is lost, and the stream goes on.
pub const REPLAY_DEADLINE: Duration = Duration::from_secs(2);
/// How often a follower checks whether its engine counts prompts with nothing heard.
const CATCH_UP_EVERY: Duration = Duration::from_secs(1);

/// Every followed engine's index, by worker name.
pub type KvIndexes = Arc<Mutex<BTreeMap<String, KvIndex>>>;

/// Starts following every source; the indexes fill as events arrive.
pub fn spawn(sources: &[KvSource], telemetry: Arc<Telemetry>) -> KvIndexes {
    let indexes: KvIndexes = Arc::default();
    for source in sources {
        // Known from the start, unheard: the scrape's counter can vouch for an
        // engine that has nothing to publish yet (`KvIndex::observe_counter`).
        indexes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(source.worker.clone(), KvIndex::default());
        let follower = Follower {
            source: source.clone(),
            indexes: indexes.clone(),
            telemetry: telemetry.clone(),
        };
        tokio::spawn(follower.run());
    }
    indexes
}

struct Follower {
    source: KvSource,
    indexes: KvIndexes,
    telemetry: Arc<Telemetry>,
}

impl Follower {
    async fn run(self) {
        let worker = &self.source.worker;
        loop {
            match self.follow().await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(%worker, endpoint = %self.source.endpoint, error = %e,
                        "KV events: the subscription failed; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn follow(&self) -> anyhow::Result<()> {
        let mut sub = SubSocket::new();
        sub.connect(&self.source.endpoint).await?;
        sub.subscribe("").await?;
        tracing::info!(worker = %self.source.worker, endpoint = %self.source.endpoint,
            "KV events: subscribed");
        let mut check = tokio::time::interval(CATCH_UP_EVERY);
        loop {
            let frames = tokio::select! {
                frames = sub.recv() => frames?.into_vec(),
                _ = check.tick() => {
                    self.catch_up().await;
                    continue;
                }
            };
            let refs: Vec<&[u8]> = frames.iter().map(Bytes::as_ref).collect();
            match decode_message(&refs) {
                Ok(m) if self.with_index(|ix| ix.is_replayed(m.seq, m.batch.ts)) => {}
                Ok(m) => self.take(m).await,
                Err(e) => {
                    self.telemetry
                        .kv_malformed
                        .get_or_create(&self.label())
                        .inc();
                    tracing::warn!(worker = %self.source.worker, error = %e,
                        "KV events: a message that does not decode was skipped");
                }
            }
        }
    }

    fn label(&self) -> EngineLabel {
        EngineLabel {
            engine: self.source.worker.clone(),
        }
    }

    /// Applies `m` in order: a gap before it is replayed first (or lost), a
    /// restart empties the index.
    async fn take(&self, m: Message) {
        let arrival = self.with_index(|ix| ix.arrival(m.seq));
        match arrival {
            Arrival::Next => {}
            // Joined late (a subscriber misses what was sent before it connected):
            // what the replay buffer still holds is caught up with; what it no longer
            // holds no subscriber could know.
            Arrival::First => {
                if let Some(batches) = self.replayed(0, m.seq).await {
                    self.apply(&batches);
                }
            }
            Arrival::Restart => {
                self.with_index(KvIndex::restart);
                self.telemetry
                    .kv_restarts
                    .get_or_create(&self.label())
                    .inc();
                tracing::info!(worker = %self.source.worker, seq = m.seq,
                    "KV events: the publisher restarted; its index starts empty");
            }
            Arrival::Gap { missing_from } => {
                let outcome = match self.replayed(missing_from, m.seq).await {
                    Some(batches) => {
                        self.apply(&batches);
                        self.with_index(KvIndex::repaired);
                        "repaired"
                    }
                    _ => {
                        self.with_index(|ix| ix.unrepaired(m.seq));
                        tracing::warn!(worker = %self.source.worker, from = missing_from,
                            to = m.seq, "KV events lost: the engine's index is stale until it clears or restarts");
                        "lost"
                    }
                };
                self.telemetry
                    .kv_gaps
                    .get_or_create(&KvGapLabels {
                        engine: self.source.worker.clone(),
                        outcome,
                    })
                    .inc();
            }
        }
        self.apply(std::slice::from_ref(&m));
    }

    /// An engine that counts prompts with nothing heard (`KvIndex::catch_up_from`):
    /// what the replay socket still holds from there is taken as if heard, and the
    /// same batches arriving live afterwards are skipped.
    async fn catch_up(&self) {
        let Some(from) = self.with_index(|ix| ix.catch_up_from()) else {
            return;
        };
        let Some(Ok(batches)) = self.ask_replay(from, u64::MAX).await else {
            return;
        };
        if batches.is_empty() {
            return;
        }
        tracing::info!(worker = %self.source.worker, from, batches = batches.len(),
            "KV events: caught up from the replay socket (nothing was heard while the engine took prompts)");
        let seen: Vec<(u64, f64)> = batches.iter().map(|b| (b.seq, b.batch.ts)).collect();
        for b in batches {
            self.take(b).await;
        }
        self.with_index(|ix| ix.caught_up(seen));
    }

    /// Applies `batches` in order, and shows the index in the metrics.
    fn apply(&self, batches: &[Message]) {
        let (blocks, trust) = self.with_index(|ix| {
            for b in batches {
                ix.apply(b.seq, &b.batch);
            }
            (ix.blocks(), ix.trust())
        });
        let label = self.label();
        let events: usize = batches.iter().map(|b| b.batch.events.len()).sum();
        self.telemetry
            .kv_events
            .get_or_create(&label)
            .inc_by(events as u64);
        self.telemetry
            .kv_blocks
            .get_or_create(&label)
            .set(i64::try_from(blocks).unwrap_or(i64::MAX));
        set_trust(&self.telemetry, &label, trust);
    }

    /// Batches `from..until` from the replay socket, if it has them all in time.
    async fn replayed(&self, from: u64, until: u64) -> Option<Vec<Message>> {
        if from >= until {
            return None;
        }
        match self.ask_replay(from, until).await? {
            Ok(batches) if covers(&batches, from, until) => Some(batches),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(worker = %self.source.worker, error = %e, "KV events: the replay failed");
                None
            }
        }
    }

    /// What the replay socket holds from `from` until `until`; `None`: the engine
    /// has no replay socket, or it did not answer within `REPLAY_DEADLINE`.
    async fn ask_replay(&self, from: u64, until: u64) -> Option<anyhow::Result<Vec<Message>>> {
        let endpoint = self.source.replay.as_deref()?;
        tokio::time::timeout(REPLAY_DEADLINE, replay(endpoint, from, until))
            .await
            .ok()
    }

    fn with_index<T>(&self, f: impl FnOnce(&mut KvIndex) -> T) -> T {
        let mut all = self
            .indexes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(all.entry(self.source.worker.clone()).or_default())
    }
}

/// The trust gauges of one engine's index.
fn set_trust(telemetry: &Telemetry, label: &EngineLabel, trust: Trust) {
    let flag = |t: Trust| i64::from(trust == t);
    telemetry
        .kv_stale
        .get_or_create(label)
        .set(flag(Trust::Stale));
    telemetry
        .kv_quiet
        .get_or_create(label)
        .set(flag(Trust::Quiet));
}

/// Each followed engine's prompt-token counter, as scraped: an engine that counts
/// many tokens and publishes nothing goes quiet (`KvIndex::observe_counter`).
pub fn observe_counters<'a>(
    indexes: &KvIndexes,
    counters: impl IntoIterator<Item = (&'a str, u64)>,
    telemetry: &Telemetry,
) {
    let mut all = indexes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (worker, total) in counters {
        if let Some(ix) = all.get_mut(worker) {
            ix.observe_counter(total);
            let label = EngineLabel {
                engine: worker.to_string(),
            };
            set_trust(telemetry, &label, ix.trust());
        }
    }
}

/// Whether `batches` are exactly `from..until`, in order.
fn covers(batches: &[Message], from: u64, until: u64) -> bool {
    let seqs: Vec<u64> = batches
        .iter()
        .map(|b| b.seq)
        .filter(|&s| s < until)
        .collect();
    seqs.len() as u64 == until.saturating_sub(from)
        && seqs.iter().zip(from..).all(|(&s, want)| s == want)
}

/// Asks the replay socket at `endpoint` for the batches from `from` on, as vLLM's
/// and SGLang's publishers answer a DEALER: each buffered batch, then an end marker.
/// Those at or past `until` arrived already.
async fn replay(endpoint: &str, from: u64, until: u64) -> anyhow::Result<Vec<Message>> {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await?;
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&replay_request(from))];
    dealer
        .send(ZmqMessage::try_from(request).map_err(|e| anyhow::anyhow!("{e:?}"))?)
        .await?;
    let mut batches = Vec::new();
    loop {
        let frames = dealer.recv().await?.into_vec();
        let refs: Vec<&[u8]> = frames.iter().map(Bytes::as_ref).collect();
        match decode_replay_reply(&refs)? {
            ReplayReply::End => break,
            ReplayReply::Batch(m) if m.seq < until => batches.push(m),
            ReplayReply::Batch(_) => {}
        }
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_kv_events::EventBatch;

    fn at(seq: u64) -> Message {
        Message {
            topic: Vec::new(),
            seq,
            batch: EventBatch {
                ts: 0.0,
                events: Vec::new(),
                data_parallel_rank: None,
            },
        }
    }

    #[test]
    fn scraped_counters_make_a_silent_engine_quiet_in_the_metrics() {
        let telemetry = Telemetry::new(&[], Duration::from_secs(60), Duration::from_secs(60));
        let indexes: KvIndexes = Arc::default();
        indexes
            .lock()
            .unwrap()
            .entry("w0".into())
            .or_default()
            .apply(0, &at(0).batch);
        let quiet = |text: &str| text.contains("llm_collector_kv_quiet{engine=\"w0\"} 1");
        observe_counters(&indexes, [("w0", 100), ("w9", 5)], &telemetry);
        assert!(!quiet(&telemetry.render(std::time::Instant::now())));
        let silent = 100 + crate::kv_index::QUIET_TOKENS;
        observe_counters(&indexes, [("w0", silent)], &telemetry);
        assert!(quiet(&telemetry.render(std::time::Instant::now())));
        assert!(
            !indexes.lock().unwrap().contains_key("w9"),
            "only followed engines"
        );
    }

    #[test]
    fn a_replay_covers_a_gap_only_whole_and_in_order() {
        let got = |seqs: &[u64]| seqs.iter().map(|&s| at(s)).collect::<Vec<_>>();
        assert!(covers(&got(&[3, 4, 5]), 3, 6));
        assert!(
            covers(&got(&[3, 4, 5, 6, 7]), 3, 6),
            "later ones are ignored"
        );
        assert!(!covers(&got(&[3, 5]), 3, 6), "one missing");
        assert!(!covers(&got(&[4, 3, 5]), 3, 6), "out of order");
        assert!(!covers(&got(&[]), 3, 6));
        assert!(covers(&got(&[]), 3, 3), "nothing missing");
    }
}
