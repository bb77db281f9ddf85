//! The soak's traffic: everything that could make the router's memory grow without
//! bound if something leaked.
//!
//! - Conversations: request `i` is turn `i % turns` of conversation `i / turns`
//!   (its own session, so its turns go in order), whose system prompt is one of
//!   `system_prompts` (many: the trees keep growing until the VM budget evicts).
//! - Junk models: every `junk_every`-th request asks for a model of its own
//!   (`junk-<i>`), so trees for one-off models come and go (`max_models`).
//! - Streams: every `stream_every`-th request streams its answer.
//! - Client disconnects: every `disconnect_every`-th request is sent on a raw
//!   connection that is closed without reading the answer, after the whole body (the
//!   request is routed and in flight) or halfway through it (never routed).
//! - A frozen engine (`Freezer`): one engine is stopped (SIGSTOP) for a few seconds
//!   at a fixed period, so its requests time out, the filter takes it out and its
//!   probes bring it back once it is thawed (SIGCONT).

use anyhow::{Context, Result};
use bytes::Bytes;
use llm_load::generate::{conversation, session_id, user_message, GenerateConfig};
use llm_load::workload::{WorkItem, CHAT_PATH};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::ops::Range;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The traffic's shape (see the module doc).
#[derive(Debug, Clone)]
pub struct Churn {
    pub turns: usize,
    pub system_prompts: usize,
    pub system_prompt_chars: usize,
    pub user_chars: usize,
    pub junk_every: usize,
    pub stream_every: usize,
    pub disconnect_every: usize,
}

/// One interval's requests: those for the load tool, and the bodies sent on
/// connections that are dropped.
pub struct Batch {
    pub items: Vec<WorkItem>,
    pub disconnects: Vec<Bytes>,
}

impl Churn {
    fn generator(&self) -> GenerateConfig {
        GenerateConfig {
            system_prompts: self.system_prompts.max(1),
            system_prompt_chars: self.system_prompt_chars,
            user_chars: self.user_chars,
            ..GenerateConfig::default()
        }
    }

    /// Requests with global indexes `range`.
    pub fn batch(&self, range: Range<usize>) -> Batch {
        let cfg = self.generator();
        let turns = self.turns.max(1);
        let mut batch = Batch {
            items: Vec::with_capacity(range.len()),
            disconnects: Vec::new(),
        };
        for i in range {
            let every = |n: usize| n > 0 && i % n == n - 1;
            let (session, turn) = (i / turns, i % turns);
            let stream = every(self.stream_every);
            let (body, session) = if every(self.junk_every) {
                let text = user_message(cfg.seed, i, 0, self.user_chars);
                let body = json!({"model": format!("junk-{i}"),
                                  "messages": [{"role": "user", "content": text}],
                                  "max_tokens": 4, "stream": stream});
                (body, None)
            } else {
                let messages: Vec<Value> = conversation(&cfg, session, turn)
                    .into_iter()
                    .map(|(role, content)| json!({"role": role, "content": content}))
                    .collect();
                let body = json!({"model": "mock", "messages": messages, "max_tokens": 4,
                                  "stream": stream});
                (body, Some(session_id(session)))
            };
            let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
            if every(self.disconnect_every) {
                batch.disconnects.push(body);
                continue;
            }
            batch.items.push(WorkItem {
                line: i + 1,
                body,
                session,
                path: CHAT_PATH.to_string(),
                stream,
            });
        }
        batch
    }
}

/// Sends each body on a connection of its own and closes it without reading the
/// answer: the even ones after the whole body and a few ms (routed, in flight), the
/// odd ones halfway through the body (the filter never sees its end). Returns how
/// many connections were made.
pub async fn disconnect_all(addr: SocketAddr, bodies: Vec<Bytes>) -> usize {
    let mut made = 0;
    for (k, body) in bodies.into_iter().enumerate() {
        let Ok(mut conn) = tokio::net::TcpStream::connect(addr).await else {
            continue;
        };
        made += 1;
        let head = format!(
            "POST {CHAT_PATH} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            body.len()
        );
        let sent = if k % 2 == 0 {
            body.clone()
        } else {
            body.slice(..body.len() / 2)
        };
        if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&sent).await.is_err() {
            continue;
        }
        tokio::time::sleep(Duration::from_millis((k % 5) as u64)).await;
        drop(conn);
    }
    made
}

/// Stops one engine for `freeze` every `period` (SIGSTOP, then SIGCONT), until
/// dropped; the engine always ends thawed.
pub struct Freezer {
    stop: Arc<AtomicBool>,
    freezes: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    anyhow::ensure!(status.success(), "kill -{sig} {pid}: {status}");
    Ok(())
}

impl Freezer {
    pub fn start(pid: u32, period: Duration, freeze: Duration) -> Freezer {
        let stop = Arc::new(AtomicBool::new(false));
        let freezes = Arc::new(AtomicUsize::new(0));
        let (s, f) = (stop.clone(), freezes.clone());
        // Sleeps in small steps so a drop never waits a whole period.
        let wait = move |d: Duration| {
            let until = Instant::now() + d;
            while Instant::now() < until && !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || loop {
            wait(period);
            if stopped.load(Ordering::Relaxed) || signal(pid, "STOP").is_err() {
                return;
            }
            f.fetch_add(1, Ordering::Relaxed);
            wait(freeze);
            if signal(pid, "CONT").is_err() || stopped.load(Ordering::Relaxed) {
                return;
            }
        });
        Freezer {
            stop,
            freezes,
            thread: Some(thread),
        }
    }

    /// Freezes so far.
    pub fn freezes(&self) -> usize {
        self.freezes.load(Ordering::Relaxed)
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn churn() -> Churn {
        Churn {
            turns: 4,
            system_prompts: 100,
            system_prompt_chars: 200,
            user_chars: 50,
            junk_every: 10,
            stream_every: 4,
            disconnect_every: 25,
        }
    }

    #[test]
    fn every_request_is_an_item_or_a_disconnect_with_the_asked_shares() {
        let b = churn().batch(0..1000);
        assert_eq!(b.items.len() + b.disconnects.len(), 1000);
        assert_eq!(b.disconnects.len(), 40, "1 in 25");
        let junk = b
            .items
            .iter()
            .filter(|it| {
                let v: Value = serde_json::from_slice(&it.body).unwrap_or_default();
                v["model"].as_str().is_some_and(|m| m.starts_with("junk-"))
            })
            .count();
        // 1 in 10 is junk, less those that are disconnects too (i % 50 == 49).
        assert_eq!(junk, 100 - 20, "1 in 10 junk among the items");
        assert!(b.items.iter().filter(|it| it.stream).count() > 200);
    }

    #[test]
    fn conversations_keep_their_turns_in_one_session_and_differ() {
        let b = churn().batch(0..8);
        let sessions: Vec<_> = b.items.iter().map(|it| it.session.clone()).collect();
        assert_eq!(sessions[0], sessions[3], "turns 0..4 are one conversation");
        assert_ne!(
            sessions[0], sessions[4],
            "the next conversation is another session"
        );
        assert!(
            b.items[1].body.len() > b.items[0].body.len(),
            "history grows"
        );
        let other = churn().batch(400..401);
        assert_ne!(other.items[0].body, b.items[0].body);
    }
}
