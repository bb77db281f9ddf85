//! A seeded family of workloads and fleets, so a routing policy is judged across the
//! kinds of traffic it will meet and everything between them, never tuned on one.
//!
//! A seed draws one [`Member`]: a multi-turn chat workload ([`GenerateConfig`]), how
//! many requests are in flight, and the engine fleet it runs on (the engine mock's
//! flags per engine). Every dimension is drawn independently, so the family covers the
//! corners (one hot prompt, long documents with short questions, many short system
//! prompts, one engine slower than the others, caches that thrash) and their mixes:
//!
//! - system prompts or documents: [`SYSTEM_PROMPTS`] of [`PROMPT_CHARS`] chars each,
//!   log-uniform (a single hot prompt is as likely as 8 to 16);
//! - user turns and assistant replies of [`USER_CHARS`] chars, log-uniform (short
//!   questions about long documents, long chat turns);
//! - [`TURNS`] turns (uniform) of [`SESSIONS`] conversations (log-uniform);
//! - [`CONCURRENCY`] requests in flight (log-uniform);
//! - [`ENGINES`] engines (uniform), each with the same [`RUNNING_SLOTS`] slots
//!   (log-uniform) and a prefill cost of [`PREFILL_US_PER_TOKEN`] (log-uniform);
//! - heterogeneous speeds on half the seeds: one up to half of the engines are
//!   [`SLOW_FACTOR`] times slower at prefill (log-uniform, each its own);
//! - caches too small for the working set on half the seeds: the fleet's caches
//!   together hold [`CACHE_SHARE`] of the working set (uniform), never less than one
//!   conversation's longest prompt an engine; on the other half each engine could
//!   hold the whole working set.
//!
//! Every request streams, so every request reports its time to first token. The same
//! seed gives the same member forever (the workspace's SplitMix64). [`KINDS`] names
//! the kinds a member is of (one hot prompt, slower engines, small caches...), so a
//! sweep can be read kind by kind.

use crate::generate::{Draws, GenerateConfig};
use std::ops::RangeInclusive;

/// Distinct system prompts (or documents) a workload shares between conversations.
pub const SYSTEM_PROMPTS: RangeInclusive<usize> = 1..=64;
/// Characters of each system prompt or document.
pub const PROMPT_CHARS: RangeInclusive<usize> = 200..=16_000;
/// Characters of each user turn and assistant reply.
pub const USER_CHARS: RangeInclusive<usize> = 30..=600;
/// Turns per conversation.
pub const TURNS: RangeInclusive<usize> = 1..=12;
/// Conversations.
pub const SESSIONS: RangeInclusive<usize> = 16..=256;
/// Requests in flight at most.
pub const CONCURRENCY: RangeInclusive<usize> = 4..=64;
/// Engines in the fleet.
pub const ENGINES: RangeInclusive<usize> = 2..=8;
/// Requests an engine serves at once (the rest wait, first in first out).
pub const RUNNING_SLOTS: RangeInclusive<usize> = 1..=16;
/// Prefill cost per uncached prompt token of a normal engine, in microseconds.
pub const PREFILL_US_PER_TOKEN: RangeInclusive<f64> = 25.0..=200.0;
/// How many times slower a slow engine's prefill is.
pub const SLOW_FACTOR: RangeInclusive<f64> = 1.5..=6.0;
/// Under cache pressure, the share of the working set all engines' caches hold together.
pub const CACHE_SHARE: RangeInclusive<f64> = 0.25..=1.0;

/// Domain tag of the family's draws (the generator's text uses others).
const KIND_FAMILY: u64 = 0xFA;

/// One engine of a member's fleet, in the engine mock's terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineShape {
    /// Requests served at once (`--max-running`).
    pub max_running: usize,
    /// Prefill cost per uncached prompt token (`--prefill-us-per-token`).
    pub prefill_us_per_token: f64,
    /// KV cache size in characters (`--cache-blocks` x `--block-chars`).
    pub cache_chars: usize,
}

/// One workload of the family and the fleet it runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub seed: u64,
    pub workload: GenerateConfig,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// The fleet, engine `i` being worker `w{i}`.
    pub engines: Vec<EngineShape>,
}

impl Member {
    /// The member of seed `seed`.
    pub fn draw(seed: u64) -> Self {
        let mut rng = Draws::new(seed, KIND_FAMILY, 0, 0);
        let workload = GenerateConfig {
            sessions: log_uniform_int(&mut rng, SESSIONS),
            turns: uniform_int(&mut rng, TURNS),
            system_prompts: log_uniform_int(&mut rng, SYSTEM_PROMPTS),
            system_prompt_chars: log_uniform_int(&mut rng, PROMPT_CHARS),
            user_chars: log_uniform_int(&mut rng, USER_CHARS),
            seed,
            stream_fraction: 1.0,
            ..GenerateConfig::default()
        };
        let concurrency = log_uniform_int(&mut rng, CONCURRENCY);
        let engines = uniform_int(&mut rng, ENGINES);
        let max_running = log_uniform_int(&mut rng, RUNNING_SLOTS);
        let prefill = log_uniform(&mut rng, PREFILL_US_PER_TOKEN);
        let mut speeds = vec![1.0; engines];
        if rng.unit() < 0.5 {
            let slow = uniform_int(&mut rng, 1..=(engines / 2).max(1));
            let first = uniform_int(&mut rng, 0..=engines - 1);
            for k in 0..slow {
                speeds[(first + k) % engines] = log_uniform(&mut rng, SLOW_FACTOR);
            }
        }
        let working_set = working_set_chars(&workload);
        let cache_chars = if rng.unit() < 0.5 {
            let share =
                CACHE_SHARE.start() + rng.unit() * (CACHE_SHARE.end() - CACHE_SHARE.start());
            let per_engine = (share * working_set as f64 / engines as f64) as usize;
            per_engine.max(longest_prompt_chars(&workload))
        } else {
            working_set
        };
        Member {
            seed,
            workload,
            concurrency,
            engines: speeds
                .into_iter()
                .map(|slower| EngineShape {
                    max_running,
                    prefill_us_per_token: prefill * slower,
                    cache_chars,
                })
                .collect(),
        }
    }

    /// The fleet's caches together, as a share of the working set (below 1: they
    /// cannot hold it all, however the requests are placed).
    pub fn cache_share(&self) -> f64 {
        let total: usize = self.engines.iter().map(|e| e.cache_chars).sum();
        total as f64 / working_set_chars(&self.workload).max(1) as f64
    }

    /// One line: the workload, the load and the fleet.
    pub fn describe(&self) -> String {
        let w = &self.workload;
        let fastest = self
            .engines
            .iter()
            .map(|e| e.prefill_us_per_token)
            .fold(f64::INFINITY, f64::min);
        let slow: Vec<String> = self
            .engines
            .iter()
            .enumerate()
            .filter(|(_, e)| e.prefill_us_per_token > fastest)
            .map(|(i, e)| format!("w{i} x{:.1}", e.prefill_us_per_token / fastest))
            .collect();
        let slots = self.engines.first().map_or(0, |e| e.max_running);
        let cache = self.engines.first().map_or(0, |e| e.cache_chars);
        format!(
            "{} conv x {} turns, {} prompts x {} chars, turns {} chars, {} in flight; \
             {} engines x {} slots, prefill {:.0} us/token{}, cache {}k chars each ({:.2} of working set)",
            w.sessions,
            w.turns,
            w.system_prompts,
            w.system_prompt_chars,
            w.user_chars,
            self.concurrency,
            self.engines.len(),
            slots,
            fastest,
            if slow.is_empty() {
                String::new()
            } else {
                format!(" ({} slower)", slow.join(", "))
            },
            cache / 1000,
            self.cache_share(),
        )
    }
}

/// A kind of traffic or fleet, for reading a sweep kind by kind; a member is of
/// several kinds at once.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub name: &'static str,
    pub of: fn(&Member) -> bool,
}

/// The kinds the cases are made of, and their complements where a policy's
/// behaviour turns on the difference.
pub const KINDS: [Kind; 8] = [
    Kind {
        name: "one hot prompt",
        of: |m| m.workload.system_prompts == 1,
    },
    Kind {
        name: "prompts <= engines",
        of: |m| m.workload.system_prompts <= m.engines.len(),
    },
    Kind {
        name: "prompts > engines",
        of: |m| m.workload.system_prompts > m.engines.len(),
    },
    Kind {
        name: "documents >= 8k chars",
        of: |m| m.workload.system_prompt_chars >= 8000,
    },
    Kind {
        name: "1 or 2 slots",
        of: |m| m.engines.iter().all(|e| e.max_running <= 2),
    },
    Kind {
        name: "slower engines",
        of: |m| {
            let first = m.engines.first().map(|e| e.prefill_us_per_token);
            m.engines
                .iter()
                .any(|e| Some(e.prefill_us_per_token) != first)
        },
    },
    Kind {
        name: "small caches",
        of: |m| m.cache_share() < 1.0,
    },
    Kind {
        name: "ample caches",
        of: |m| m.cache_share() >= 1.0,
    },
];

/// Distinct prompt text the workload sends: its system prompts and every
/// conversation's turns (what a fleet would cache to hit on everything).
pub fn working_set_chars(w: &GenerateConfig) -> usize {
    let prompts = w.system_prompts.min(w.sessions) * w.system_prompt_chars;
    prompts + w.sessions * w.turns * 2 * w.user_chars
}

/// The longest prompt of the workload: a last turn's whole conversation.
fn longest_prompt_chars(w: &GenerateConfig) -> usize {
    w.system_prompt_chars + w.turns * 2 * w.user_chars
}

/// Uniform in `range`.
fn uniform_int(rng: &mut Draws, range: RangeInclusive<usize>) -> usize {
    let (lo, hi) = (*range.start(), *range.end());
    (lo + (rng.unit() * (hi - lo + 1) as f64) as usize).min(hi)
}

/// Log-uniform in `range`: each doubling is as likely as the next.
fn log_uniform(rng: &mut Draws, range: RangeInclusive<f64>) -> f64 {
    let (lo, hi) = (*range.start(), *range.end());
    lo * (hi / lo).powf(rng.unit())
}

/// Log-uniform over the integers of `range`: the integer part of a log-uniform draw
/// in `[lo, hi + 1)`, so each doubling is about as likely as the next.
fn log_uniform_int(rng: &mut Draws, range: RangeInclusive<usize>) -> usize {
    let (lo, hi) = (*range.start(), *range.end());
    let x = log_uniform(rng, lo as f64..=(hi + 1) as f64).floor() as usize;
    x.clamp(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, to_jsonl};

    #[test]
    fn a_seed_is_one_member_forever() {
        let a = Member::draw(7);
        assert_eq!(a, Member::draw(7), "same seed, same member");
        assert_eq!(
            to_jsonl(&generate(&a.workload)).unwrap(),
            to_jsonl(&generate(&Member::draw(7).workload)).unwrap(),
            "same seed, same workload bytes"
        );
        assert_ne!(a, Member::draw(8), "another seed, another member");
    }

    #[test]
    fn the_family_covers_its_ranges_and_its_corners() {
        let members: Vec<Member> = (0..400).map(Member::draw).collect();
        let spans = |f: &dyn Fn(&Member) -> usize| {
            let v: Vec<usize> = members.iter().map(f).collect();
            (*v.iter().min().unwrap(), *v.iter().max().unwrap())
        };
        let within = |(lo, hi): (usize, usize), r: &RangeInclusive<usize>, near: usize| {
            r.contains(&lo) && r.contains(&hi) && lo <= r.start() + near && hi + near >= *r.end()
        };
        let prompts = spans(&|m| m.workload.system_prompts);
        assert!(within(prompts, &SYSTEM_PROMPTS, 0), "prompts {prompts:?}");
        let chars = spans(&|m| m.workload.system_prompt_chars);
        assert!(within(chars, &PROMPT_CHARS, 1000), "prompt chars {chars:?}");
        let user = spans(&|m| m.workload.user_chars);
        assert!(within(user, &USER_CHARS, 20), "user chars {user:?}");
        let turns = spans(&|m| m.workload.turns);
        assert!(within(turns, &TURNS, 0), "turns {turns:?}");
        let sessions = spans(&|m| m.workload.sessions);
        assert!(within(sessions, &SESSIONS, 10), "sessions {sessions:?}");
        let inflight = spans(&|m| m.concurrency);
        assert!(
            within(inflight, &CONCURRENCY, 2),
            "concurrency {inflight:?}"
        );
        let engines = spans(&|m| m.engines.len());
        assert!(within(engines, &ENGINES, 0), "engines {engines:?}");
        let slots = spans(&|m| m.engines[0].max_running);
        assert!(within(slots, &RUNNING_SLOTS, 0), "slots {slots:?}");
        for m in &members {
            let fastest = m
                .engines
                .iter()
                .map(|e| e.prefill_us_per_token)
                .fold(f64::MAX, f64::min);
            assert!(PREFILL_US_PER_TOKEN.contains(&fastest), "seed {}", m.seed);
            let slow = m
                .engines
                .iter()
                .filter(|e| e.prefill_us_per_token > fastest)
                .count();
            assert!(
                slow <= (m.engines.len() / 2).max(1),
                "seed {}: {slow} slow",
                m.seed
            );
            assert!(m
                .engines
                .iter()
                .all(|e| e.max_running == m.engines[0].max_running));
            assert!(m.engines[0].cache_chars >= longest_prompt_chars(&m.workload));
            assert_eq!(
                m.workload.stream_fraction, 1.0,
                "every request reports TTFT"
            );
        }
        let share = |p: &dyn Fn(&Member) -> bool| members.iter().filter(|m| p(m)).count();
        let of = |name: &str| KINDS.iter().find(|k| k.name == name).map(|k| share(&k.of));
        for kind in KINDS {
            let n = share(&kind.of);
            assert!(n >= 20, "{n} of 400 of kind {}", kind.name);
        }
        // Half the seeds each, give or take the draw.
        for half in ["slower engines", "small caches"] {
            let n = of(half).unwrap_or(0);
            assert!((150..=250).contains(&n), "{n} of 400 of kind {half}");
        }
        let documents =
            share(&|m| m.workload.system_prompt_chars >= 8000 && m.workload.user_chars <= 100);
        assert!(
            documents >= 10,
            "{documents} of 400 long documents with short questions"
        );
    }
}
