//! Deterministic multi-turn chat workload generator.
//!
//! The workload is shaped to exercise a cache-aware router: sessions share a few long
//! system prompts (shared prefixes across sessions) and each turn resends the whole
//! conversation so far (a growing per-session prefix). Lines interleave sessions turn by
//! turn so that a concurrent replay mixes sessions the way real traffic does.
//!
//! Randomness comes from the filter crate's SplitMix64 seeded from (seed, kind, session,
//! turn): it is stable across Rust and crate versions, so the same arguments give a
//! byte-identical file forever, and each piece of text is independent of the others
//! (changing `--turns` does not change turn 0's text).

use crate::workload::{WorkloadLine, CHAT_PATH, COMPLETIONS_PATH};
use llm_router::rng::{Rng as _, SplitMix64};
use serde_json::{json, Value};

/// Generator parameters; see `llm-load generate --help`.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    pub sessions: usize,
    pub turns: usize,
    pub system_prompts: usize,
    pub system_prompt_chars: usize,
    pub user_chars: usize,
    pub seed: u64,
    /// Fraction (0..=1) of requests sent with `"stream": true`.
    pub stream_fraction: f64,
    pub model: String,
    /// Emit `/v1/completions` bodies with a flattened `prompt` instead of `messages`.
    pub completions: bool,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            sessions: 32,
            turns: 4,
            system_prompts: 4,
            system_prompt_chars: 2000,
            user_chars: 200,
            seed: 42,
            stream_fraction: 0.0,
            model: "mock".to_string(),
            completions: false,
        }
    }
}

/// Small, fixed vocabulary so the text looks like prose and tokenizes like prose.
const WORDS: &[&str] = &[
    "the",
    "system",
    "answer",
    "question",
    "model",
    "carefully",
    "always",
    "never",
    "user",
    "request",
    "context",
    "detail",
    "explain",
    "simple",
    "clear",
    "policy",
    "data",
    "value",
    "result",
    "method",
    "example",
    "should",
    "could",
    "would",
    "before",
    "after",
    "during",
    "because",
    "however",
    "therefore",
    "report",
    "summary",
    "review",
    "check",
    "test",
    "network",
    "server",
    "client",
    "cache",
    "prefix",
    "token",
    "memory",
    "engine",
    "worker",
    "route",
    "balance",
    "latency",
    "throughput",
    "queue",
    "batch",
    "stream",
    "response",
    "helpful",
    "concise",
    "accurate",
    "polite",
    "format",
    "list",
    "table",
    "step",
    "reason",
    "first",
    "second",
    "third",
    "finally",
    "also",
    "only",
    "each",
    "every",
    "some",
    "many",
    "small",
    "large",
    "quick",
    "slow",
    "early",
    "late",
    "open",
    "close",
    "read",
    "write",
    "build",
    "deploy",
    "measure",
    "compare",
    "improve",
    "change",
    "keep",
    "avoid",
    "use",
    "make",
    "find",
    "show",
    "tell",
    "give",
    "take",
    "and",
    "or",
    "with",
    "without",
    "for",
    "from",
    "into",
    "about",
    "under",
    "over",
    "between",
    "within",
    "a",
    "an",
    "is",
    "are",
    "was",
    "be",
    "this",
    "that",
    "these",
    "those",
    "it",
    "you",
    "we",
    "they",
    "of",
    "to",
    "in",
    "on",
    "at",
    "by",
    "as",
    "if",
    "when",
    "where",
    "how",
    "why",
    "what",
    "which",
];

/// Capitalised opening words, one per letter: system prompt `i` starts with
/// `OPENERS[i % 26]`, so up to 26 distinct system prompts differ from their very first
/// character (no accidental shared prefix between different prompts).
const OPENERS: &[&str] = &[
    "Always",
    "Be",
    "Consider",
    "Do",
    "Every",
    "For",
    "Given",
    "Help",
    "If",
    "Just",
    "Keep",
    "Listen",
    "Make",
    "Never",
    "Only",
    "Please",
    "Quickly",
    "Read",
    "Stay",
    "Think",
    "Use",
    "Verify",
    "When",
    "Xenial",
    "You",
    "Zealously",
];

/// Domain tags mixed into seeds so different kinds of text never share a stream.
const KIND_SYSTEM: u64 = 1;
const KIND_USER: u64 = 2;
const KIND_ASSISTANT: u64 = 3;
const KIND_STREAM: u64 = 4;

/// A stream of the workspace's SplitMix64 (the filter crate's: tiny, well-distributed,
/// and fully specified, so a workload's bytes are stable forever), seeded from
/// coordinates.
#[derive(Debug, Clone)]
pub(crate) struct Draws(SplitMix64);

impl Draws {
    pub(crate) fn new(seed: u64, kind: u64, a: u64, b: u64) -> Self {
        // Fold the coordinates through the mixer so nearby inputs give unrelated streams.
        let mut s = SplitMix64(seed);
        for part in [kind, a, b] {
            s.0 ^= part.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            s.next_u64();
        }
        Draws(s)
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Appends random words (space-separated) to `out` until it holds exactly `chars` chars.
fn fill_words(rng: &mut Draws, out: &mut String, chars: usize) {
    while out.len() < chars {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[rng.below(WORDS.len())]);
    }
    // All text is ASCII, so truncating at a byte index is a char boundary.
    out.truncate(chars);
}

/// System prompt `index`: `chars` characters starting with a per-index opener word.
pub fn system_prompt(seed: u64, index: usize, chars: usize) -> String {
    let mut rng = Draws::new(seed, KIND_SYSTEM, index as u64, 0);
    let mut text = String::with_capacity(chars + 16);
    text.push_str(OPENERS[index % OPENERS.len()]);
    fill_words(&mut rng, &mut text, chars);
    text
}

/// The user message of `session` at `turn`: tagged with both so no two are equal.
pub fn user_message(seed: u64, session: usize, turn: usize, chars: usize) -> String {
    let mut rng = Draws::new(seed, KIND_USER, session as u64, turn as u64);
    let mut text = format!("[session {session} turn {turn}] Please");
    let target = chars.max(text.len());
    fill_words(&mut rng, &mut text, target);
    text
}

/// The assistant reply that the workload pretends was given at `turn` of `session`.
pub fn assistant_reply(seed: u64, session: usize, turn: usize, chars: usize) -> String {
    let mut rng = Draws::new(seed, KIND_ASSISTANT, session as u64, turn as u64);
    let mut text = String::from("Sure.");
    let target = chars.max(text.len());
    fill_words(&mut rng, &mut text, target);
    text
}

/// The chat messages of `session` at `turn`: system, then (user, assistant) for each
/// earlier turn, then the new user message — `2 * turn + 2` messages.
pub fn conversation(cfg: &GenerateConfig, session: usize, turn: usize) -> Vec<(String, String)> {
    let sys_index = session % cfg.system_prompts.max(1);
    let mut msgs = Vec::with_capacity(2 * turn + 2);
    msgs.push((
        "system".to_string(),
        system_prompt(cfg.seed, sys_index, cfg.system_prompt_chars),
    ));
    for earlier in 0..turn {
        msgs.push((
            "user".to_string(),
            user_message(cfg.seed, session, earlier, cfg.user_chars),
        ));
        msgs.push((
            "assistant".to_string(),
            assistant_reply(cfg.seed, session, earlier, cfg.user_chars),
        ));
    }
    msgs.push((
        "user".to_string(),
        user_message(cfg.seed, session, turn, cfg.user_chars),
    ));
    msgs
}

/// Flattens a conversation into one completions prompt, keeping the same prefix
/// structure (system first, history in order) as the chat form.
pub fn flatten(messages: &[(String, String)]) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        let label = match role.as_str() {
            "system" => "System",
            "user" => "User",
            "assistant" => "Assistant",
            other => other,
        };
        out.push_str(label);
        out.push_str(": ");
        out.push_str(content);
        out.push_str("\n\n");
    }
    out.push_str("Assistant:");
    out
}

/// Stable session id, zero-padded so ids sort in session order.
pub fn session_id(session: usize) -> String {
    format!("session-{session:04}")
}

/// Builds the workload lines: all sessions' turn 0, then all turn 1, and so on.
pub fn generate(cfg: &GenerateConfig) -> Vec<WorkloadLine> {
    let mut lines = Vec::with_capacity(cfg.sessions * cfg.turns);
    for turn in 0..cfg.turns {
        for session in 0..cfg.sessions {
            let msgs = conversation(cfg, session, turn);
            let stream = cfg.stream_fraction > 0.0
                && Draws::new(cfg.seed, KIND_STREAM, session as u64, turn as u64).unit()
                    < cfg.stream_fraction;
            let mut body = serde_json::Map::new();
            body.insert("model".into(), json!(cfg.model));
            if cfg.completions {
                body.insert("prompt".into(), json!(flatten(&msgs)));
            } else {
                let messages: Vec<Value> = msgs
                    .iter()
                    .map(|(role, content)| json!({"role": role, "content": content}))
                    .collect();
                body.insert("messages".into(), Value::Array(messages));
            }
            body.insert("max_tokens".into(), json!(64));
            if stream {
                body.insert("stream".into(), json!(true));
                // Real OpenAI-compatible servers only report usage in a stream when asked.
                body.insert("stream_options".into(), json!({"include_usage": true}));
            }
            let path = if cfg.completions {
                COMPLETIONS_PATH
            } else {
                CHAT_PATH
            };
            lines.push(WorkloadLine {
                body: Value::Object(body),
                session: Some(session_id(session)),
                path: Some(path.to_string()),
            });
        }
    }
    lines
}

/// Renders the workload as JSONL text (one line per request, trailing newline).
pub fn to_jsonl(lines: &[WorkloadLine]) -> anyhow::Result<String> {
    let mut out = String::new();
    for line in lines {
        out.push_str(&serde_json::to_string(line)?);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::parse_workload;

    fn small() -> GenerateConfig {
        GenerateConfig {
            sessions: 6,
            turns: 3,
            system_prompts: 3,
            system_prompt_chars: 300,
            user_chars: 50,
            ..GenerateConfig::default()
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let a = to_jsonl(&generate(&small())).unwrap();
        let b = to_jsonl(&generate(&small())).unwrap();
        assert_eq!(a, b);
        let other = to_jsonl(&generate(&GenerateConfig { seed: 7, ..small() })).unwrap();
        assert_ne!(a, other);
    }

    #[test]
    fn shape_interleaving_and_message_counts() {
        let cfg = small();
        let lines = generate(&cfg);
        assert_eq!(lines.len(), 18);
        for (i, line) in lines.iter().enumerate() {
            let turn = i / cfg.sessions;
            let session = i % cfg.sessions;
            assert_eq!(line.session.as_deref(), Some(session_id(session).as_str()));
            let msgs = line.body["messages"].as_array().unwrap();
            assert_eq!(msgs.len(), 2 * turn + 2);
            assert_eq!(msgs[0]["role"], "system");
            assert_eq!(msgs[0]["content"].as_str().unwrap().len(), 300);
            assert_eq!(msgs.last().unwrap()["role"], "user");
        }
        // Later turns extend earlier ones: turn 1's first messages equal turn 0's.
        let t0 = lines[0].body["messages"].as_array().unwrap();
        let t1 = lines[cfg.sessions].body["messages"].as_array().unwrap();
        assert_eq!(&t1[..2], &t0[..]);
        // The file parses back with the chat path.
        let items = parse_workload(&to_jsonl(&lines).unwrap()).unwrap();
        assert!(items.iter().all(|it| it.path == CHAT_PATH && !it.stream));
    }

    #[test]
    fn system_prompts_shared_or_differ_from_char_zero() {
        let cfg = small();
        let sys = |s: usize| conversation(&cfg, s, 0)[0].1.clone();
        // Sessions 0 and 3 use system prompt 0.
        assert_eq!(sys(0), sys(3));
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            assert_ne!(sys(a).as_bytes()[0], sys(b).as_bytes()[0]);
        }
        // Readable: only words, spaces, and no control characters.
        assert!(sys(0).chars().all(|c| c.is_ascii_alphabetic() || c == ' '));
    }

    #[test]
    fn completions_and_streams() {
        let cfg = GenerateConfig {
            completions: true,
            stream_fraction: 0.5,
            sessions: 20,
            ..small()
        };
        let lines = generate(&cfg);
        let items = parse_workload(&to_jsonl(&lines).unwrap()).unwrap();
        assert!(items.iter().all(|it| it.path == COMPLETIONS_PATH));
        let streams = items.iter().filter(|it| it.stream).count();
        assert!(streams > 10 && streams < 50, "{streams}");
        let prompt = lines[cfg.sessions].body["prompt"].as_str().unwrap();
        assert!(prompt.starts_with("System: "));
        assert!(prompt.ends_with("Assistant:"));
        assert!(lines[0].body.get("messages").is_none());
    }
}
