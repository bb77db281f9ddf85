//! One engine in virtual time.
//!
//! Requests are admitted in arrival order to at most `max_running` slots (0: no
//! limit), FIFO like the mock's fair semaphore. A request looks the prefix cache up
//! when it gets its slot (as the mock does), so with FIFO admission the cache sees
//! requests in arrival order and the whole schedule of a request is known when it
//! arrives: [`Engine::serve`] returns when it starts and finishes. With
//! `prefix_wait`, a cached prefix another request is still computing is waited for
//! ([`crate::computing`]). The gauges the collector scrapes (`num_waiting`,
//! `num_running`) are then a function of time.

use crate::cache::{CacheLookup, PrefixCache};
use crate::computing::Computing;
use crate::latency::Latency;

/// An engine's shape: the engine mock's flags of the same names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineSpec {
    /// Cached blocks at most (`--cache-blocks`).
    pub cache_blocks: usize,
    /// Characters per cache block (`--block-chars`).
    pub block_chars: usize,
    /// Concurrent requests at most; 0 is unlimited (`--max-running`).
    pub max_running: usize,
    /// Tokens produced per request (`--output-tokens`).
    pub output_tokens: u32,
    /// The cost model.
    pub latency: Latency,
    /// A request that finds its prefix cached while another request is still
    /// prefilling it waits for that prefill, as engines do ([`crate::computing`]);
    /// off (`--no-prefix-wait`), the prefix counts as computed from when it was
    /// inserted, a free first token no engine gives.
    pub prefix_wait: bool,
}

impl EngineSpec {
    /// Tokens an answer has unless told otherwise (`--output-tokens`).
    pub const DEFAULT_OUTPUT_TOKENS: u32 = 8;
}

impl Default for EngineSpec {
    /// The engine mock's defaults.
    fn default() -> Self {
        Self {
            cache_blocks: 4096,
            block_chars: 64,
            max_running: 0,
            output_tokens: Self::DEFAULT_OUTPUT_TOKENS,
            latency: Latency::default(),
            prefix_wait: true,
        }
    }
}

/// The schedule and cache outcome of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Served {
    /// When it arrived, got a slot, produced its first token and finished (ms).
    pub arrived_ms: f64,
    pub started_ms: f64,
    pub first_token_ms: f64,
    pub finished_ms: f64,
    /// What the prefix cache matched.
    pub lookup: CacheLookup,
}

/// A simulated engine: a prefix cache and a FIFO slot queue on a virtual clock.
#[derive(Clone, Debug)]
pub struct Engine {
    spec: EngineSpec,
    cache: PrefixCache,
    /// Requests not finished yet as `(arrived, started, finished)`, oldest first.
    live: Vec<(f64, f64, f64)>,
    /// The cached blocks whose prefill is not done yet.
    computing: Computing,
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(spec: EngineSpec) -> Self {
        Self {
            cache: PrefixCache::new(spec.cache_blocks, spec.block_chars.max(1)),
            spec,
            live: Vec::new(),
            computing: Computing::default(),
        }
    }

    /// The engine's shape.
    pub fn spec(&self) -> &EngineSpec {
        &self.spec
    }

    /// Changes the cost model from now on (the mock's `POST /admin/latency`).
    pub fn set_latency(&mut self, latency: Latency) {
        self.spec.latency = latency;
    }

    /// The prefix cache (for its usage and hit totals).
    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Serves `prompt` arriving at `now_ms`. Arrivals must come in time order.
    pub fn serve(&mut self, now_ms: f64, prompt: &str) -> Served {
        self.prefill(now_ms, prompt, self.spec.output_tokens)
    }

    /// A PD prefill engine's part: the prompt against this engine's cache, then only
    /// the first token (decode generates the rest), as the mock's `--role prefill`.
    pub fn serve_prefill(&mut self, now_ms: f64, prompt: &str) -> Served {
        self.prefill(now_ms, prompt, 1)
    }

    /// A PD decode engine's part: no prompt to compute (the KV, with the prefill
    /// engine's cache outcome `lookup`, arrives at `kv_ready_ms`), then every token,
    /// as the mock's `--role decode`.
    pub fn serve_decode(&mut self, now_ms: f64, kv_ready_ms: f64, lookup: CacheLookup) -> Served {
        let started_ms = self.start_at(now_ms);
        let first_token_ms = started_ms.max(kv_ready_ms) + self.spec.latency.ttft_ms;
        self.admit(
            now_ms,
            started_ms,
            first_token_ms,
            self.spec.output_tokens,
            lookup,
        )
    }

    fn prefill(&mut self, now_ms: f64, prompt: &str, output_tokens: u32) -> Served {
        let started_ms = self.start_at(now_ms);
        if !self.spec.prefix_wait {
            let lookup = self.cache.lookup_and_insert(prompt);
            let first_token_ms = started_ms + self.spec.latency.prefill_ms(&lookup);
            return self.admit(now_ms, started_ms, first_token_ms, output_tokens, lookup);
        }
        let (lookup, blocks) = self.cache.lookup_and_insert_blocks(prompt);
        let first_token_ms = self.computing.first_token(
            (now_ms, started_ms),
            (&blocks, lookup.matched_blocks),
            self.spec.latency.prefill_ms(&lookup),
        );
        self.admit(now_ms, started_ms, first_token_ms, output_tokens, lookup)
    }

    /// When a request arriving at `now_ms` gets its slot (FIFO behind the live ones).
    fn start_at(&mut self, now_ms: f64) -> f64 {
        self.live.retain(|&(_, _, finished)| finished > now_ms);
        match self.spec.max_running {
            0 => now_ms,
            limit => {
                // FIFO: this request starts once `live.len() - limit + 1` of those ahead
                // of it have finished (or at arrival if a slot is free).
                let mut ends: Vec<f64> = self.live.iter().map(|&(_, _, f)| f).collect();
                ends.sort_by(f64::total_cmp);
                match (self.live.len() + 1).checked_sub(limit) {
                    Some(k) if k > 0 => ends[k - 1].max(now_ms),
                    _ => now_ms,
                }
            }
        }
    }

    fn admit(
        &mut self,
        now_ms: f64,
        started_ms: f64,
        first_token_ms: f64,
        output_tokens: u32,
        lookup: CacheLookup,
    ) -> Served {
        let finished_ms = first_token_ms + self.spec.latency.decode_ms(output_tokens);
        self.live.push((now_ms, started_ms, finished_ms));
        Served {
            arrived_ms: now_ms,
            started_ms,
            first_token_ms,
            finished_ms,
            lookup,
        }
    }

    /// Requests waiting for a slot at `now_ms` (`vllm:num_requests_waiting`).
    pub fn num_waiting(&self, now_ms: f64) -> usize {
        self.live
            .iter()
            .filter(|&&(a, s, _)| a <= now_ms && now_ms < s)
            .count()
    }

    /// Requests holding a slot at `now_ms` (`vllm:num_requests_running`).
    pub fn num_running(&self, now_ms: f64) -> usize {
        self.live
            .iter()
            .filter(|&&(_, s, f)| s <= now_ms && now_ms < f)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_running: usize) -> EngineSpec {
        EngineSpec {
            max_running,
            latency: Latency {
                ttft_ms: 10.0,
                prefill_us_per_token: 0.0,
                decode_ms_per_token: 0.0,
            },
            ..EngineSpec::default()
        }
    }

    #[test]
    fn requests_beyond_max_running_wait_in_fifo_order() {
        let mut e = Engine::new(spec(2));
        let a = e.serve(0.0, "a");
        let b = e.serve(1.0, "b");
        let c = e.serve(2.0, "c");
        let d = e.serve(3.0, "d");
        assert_eq!((a.started_ms, b.started_ms), (0.0, 1.0));
        assert_eq!(c.started_ms, 10.0, "c takes a's slot when a finishes");
        assert_eq!(d.started_ms, 11.0, "d takes b's slot");
        assert_eq!((e.num_running(5.0), e.num_waiting(5.0)), (2, 2));
        assert_eq!((e.num_running(10.5), e.num_waiting(10.5)), (2, 1));
        assert_eq!((e.num_running(30.0), e.num_waiting(30.0)), (0, 0));
    }

    #[test]
    fn pd_roles_split_the_work() {
        let mut prefill = Engine::new(EngineSpec {
            latency: Latency {
                ttft_ms: 0.0,
                prefill_us_per_token: 1000.0,
                decode_ms_per_token: 5.0,
            },
            ..spec(0)
        });
        let p = prefill.serve_prefill(0.0, &"x".repeat(400));
        assert_eq!(p.first_token_ms, 100.0, "100 uncached tokens at 1 ms");
        assert_eq!(p.finished_ms, 100.0, "prefill stops at the first token");
        let mut decode = Engine::new(EngineSpec {
            latency: Latency {
                ttft_ms: 2.0,
                prefill_us_per_token: 1000.0,
                decode_ms_per_token: 5.0,
            },
            ..spec(0)
        });
        let d = decode.serve_decode(0.0, p.finished_ms, p.lookup);
        assert_eq!(
            d.first_token_ms, 102.0,
            "waits for the KV, computes no prompt"
        );
        assert_eq!(d.finished_ms, 102.0 + 7.0 * 5.0);
        assert_eq!(d.lookup, p.lookup);
        assert_eq!(decode.cache().usage(), 0.0, "decode caches nothing");
    }

    #[test]
    fn unlimited_engines_never_queue_and_a_repeat_hits_the_cache() {
        let mut e = Engine::new(spec(0));
        let prompt = "x".repeat(640);
        let first = e.serve(0.0, &prompt);
        let again = e.serve(20.0, &prompt);
        assert_eq!(first.started_ms, 0.0);
        assert_eq!(first.lookup.cached_tokens, 0);
        assert_eq!(again.lookup.cached_tokens, 160, "all 10 blocks are cached");
        assert_eq!(again.first_token_ms, 30.0, "computed: only the fixed TTFT");
        assert_eq!(e.num_waiting(0.0), 0);
    }

    #[test]
    fn a_prefix_still_being_computed_is_waited_for() {
        let slow_prefill = EngineSpec {
            latency: Latency {
                ttft_ms: 0.0,
                prefill_us_per_token: 1000.0,
                decode_ms_per_token: 0.0,
            },
            ..spec(0)
        };
        let document = "d".repeat(640);
        // Without `prefix_wait`, the prefix counts as computed once inserted.
        let mut credited = Engine::new(EngineSpec {
            prefix_wait: false,
            ..slow_prefill
        });
        credited.serve(0.0, &format!("{document}first question"));
        let second = credited.serve(10.0, &format!("{document}another one"));
        assert_eq!(second.first_token_ms, 10.0 + 3.0);
        let mut e = Engine::new(EngineSpec {
            prefix_wait: true,
            ..slow_prefill
        });
        let first = e.serve(0.0, &format!("{document}first question"));
        assert_eq!(first.first_token_ms, 164.0, "164 uncached tokens at 1 ms");
        // Another question about the document 10 ms later, a slot free: the
        // document is cached, its prefill 154 ms from done.
        let second = e.serve(10.0, &format!("{document}another one"));
        assert_eq!(second.started_ms, 10.0);
        assert_eq!(second.lookup.cached_tokens, 160);
        assert_eq!(
            second.first_token_ms,
            164.0 + 3.0,
            "the document's, then its own"
        );
        // Once it is computed, a third waits for nobody.
        let third = e.serve(200.0, &format!("{document}and a third"));
        assert_eq!(third.first_token_ms, 200.0 + 3.0);
        // A prompt that shares none of it waits for nothing either.
        let other = e.serve(201.0, &"o".repeat(64));
        assert_eq!(other.first_token_ms, 201.0 + 16.0);
    }
}
