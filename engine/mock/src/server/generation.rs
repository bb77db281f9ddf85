//! The per-request generation task: it waits for a running slot, consults the prefix
//! cache (waiting for a prefix another request is still computing), sleeps the
//! simulated prefill, then produces the response's tokens into the channel its
//! `ChannelBody` reads, as one JSON body or SSE chunks.

use super::{lock, State};
use crate::cache::CacheLookup;
use crate::pd::Transfer;
use crate::prompt::Endpoint;
use bytes::Bytes;
use engine_model::latency::Latency;
use hyper::body::Frame;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// One admitted completion request, everything the generation task needs.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) endpoint: Endpoint,
    pub(super) prompt: String,
    pub(super) stream: bool,
    pub(super) output_tokens: u32,
    pub(super) model: String,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) arrived: Instant,
    /// Prefill role: rooms to publish once the prompt is computed.
    pub(super) publish: Vec<u64>,
    /// Decode role: the KV fetched from the prefill engine (no prefill here).
    pub(super) kv: Option<Transfer>,
}

/// A response body fed by the generation task, frame by frame as it produces them (truly
/// streamed, never buffered). Dropping it closes the channel, which stops the task.
pub(super) struct ChannelBody {
    pub(super) first: Option<Bytes>,
    pub(super) rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// Runs a job until it finishes or its receiver disappears (client gone), whichever is first.
/// Either way the slot, held inside `generate`, is dropped here.
pub(super) async fn run_job(state: Arc<State>, job: Job, tx: mpsc::Sender<Bytes>) {
    tokio::select! {
        _ = tx.closed() => {}
        _ = generate(&state, &job, &tx) => {}
    }
}

fn sleep_ms(ms: f64) -> Option<Duration> {
    (ms.is_finite() && ms > 0.0).then(|| Duration::from_secs_f64(ms / 1000.0))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn generate(state: &State, job: &Job, tx: &mpsc::Sender<Bytes>) {
    let _slot = state.slots.acquire().await;
    let latency = Latency {
        ttft_ms: state.ttft_ms.get(),
        prefill_us_per_token: state.prefill_us_per_token.get(),
        decode_ms_per_token: state.decode_ms_per_token.get(),
    };
    let (lookup, prefill_ms) = match &job.kv {
        // Decode received the KV: the prompt was computed (and cached) on prefill,
        // and it computes none.
        Some(t) => (
            CacheLookup {
                prompt_chars: job.prompt.len(),
                total_blocks: 0,
                matched_blocks: 0,
                prompt_tokens: t.prompt_tokens,
                cached_tokens: t.cached_tokens,
            },
            latency.ttft_ms,
        ),
        None => state.start_prefill(&job.prompt, &latency),
    };
    lock(&state.registry).prompt_tokens += lookup.prompt_tokens as u64;

    if let Some(d) = sleep_ms(prefill_ms) {
        tokio::time::sleep(d).await;
    }

    let n = job.output_tokens;
    let mut text = String::new();
    let mut last_token_at = job.arrived;
    for i in 0..n {
        if i > 0 {
            if let Some(d) = sleep_ms(state.decode_ms_per_token.get()) {
                tokio::time::sleep(d).await;
            }
        }
        let now = Instant::now();
        {
            let mut reg = lock(&state.registry);
            let elapsed = now.duration_since(last_token_at).as_secs_f64();
            if i == 0 {
                reg.ttft.observe(elapsed);
            } else {
                reg.tpot.observe(elapsed);
            }
            reg.generation_tokens += 1;
        }
        last_token_at = now;
        let piece = if i == 0 {
            format!("tok{i}")
        } else {
            format!(" tok{i}")
        };
        text.push_str(&piece);
        if job.stream {
            let chunk = stream_chunk(job, i, &piece, &text, &lookup);
            if tx.send(sse(&chunk)).await.is_err() {
                return;
            }
        }
    }
    lock(&state.registry).request_success += 1;
    for &room in &job.publish {
        state.rooms.publish(Transfer {
            room,
            prefill_worker: state.cfg.worker_id.clone(),
            prompt_tokens: lookup.prompt_tokens,
            cached_tokens: lookup.cached_tokens,
        });
    }

    let usage = json!({
        "prompt_tokens": lookup.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": lookup.prompt_tokens + n as usize,
        "prompt_tokens_details": {"cached_tokens": lookup.cached_tokens},
    });
    let worker = &state.cfg.worker_id;
    if job.stream {
        let mut last = json!({
            "id": job.id,
            "created": job.created,
            "model": job.model,
            "choices": [],
            "usage": usage,
            "worker": worker,
        });
        if let Some(object) = chunk_object(job.endpoint) {
            last["object"] = json!(object);
        }
        if tx.send(sse(&last)).await.is_ok() {
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        }
    } else {
        let body = match job.endpoint {
            Endpoint::Chat => json!({
                "id": job.id,
                "object": "chat.completion",
                "created": job.created,
                "model": job.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }],
                "usage": usage,
                "worker": worker,
            }),
            Endpoint::Completions => json!({
                "id": job.id,
                "object": "text_completion",
                "created": job.created,
                "model": job.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}],
                "usage": usage,
                "worker": worker,
            }),
            Endpoint::Generate => json!({
                "text": text,
                "meta_info": meta_info(job, &lookup, n, true),
                "usage": usage,
                "worker": worker,
            }),
        };
        let _ = tx.send(Bytes::from(body.to_string())).await;
    }
}

fn chunk_object(endpoint: Endpoint) -> Option<&'static str> {
    match endpoint {
        Endpoint::Chat => Some("chat.completion.chunk"),
        Endpoint::Completions => Some("text_completion"),
        Endpoint::Generate => None,
    }
}

/// SGLang's `meta_info` block.
fn meta_info(job: &Job, lookup: &crate::cache::CacheLookup, produced: u32, done: bool) -> Value {
    json!({
        "id": job.id,
        "prompt_tokens": lookup.prompt_tokens,
        "completion_tokens": produced,
        "cached_tokens": lookup.cached_tokens,
        "finish_reason": if done { json!({"type": "length", "length": job.output_tokens}) } else { Value::Null },
    })
}

/// One streamed token in the endpoint's shape (SGLang streams cumulative text).
fn stream_chunk(
    job: &Job,
    i: u32,
    piece: &str,
    text_so_far: &str,
    lookup: &crate::cache::CacheLookup,
) -> Value {
    let last = i + 1 == job.output_tokens;
    let finish = if last { json!("length") } else { Value::Null };
    match job.endpoint {
        Endpoint::Chat => {
            let delta = if i == 0 {
                json!({"role": "assistant", "content": piece})
            } else {
                json!({"content": piece})
            };
            json!({
                "id": job.id,
                "object": "chat.completion.chunk",
                "created": job.created,
                "model": job.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })
        }
        Endpoint::Completions => json!({
            "id": job.id,
            "object": "text_completion",
            "created": job.created,
            "model": job.model,
            "choices": [{"index": 0, "text": piece, "logprobs": null, "finish_reason": finish}],
        }),
        Endpoint::Generate => json!({
            "text": text_so_far,
            "meta_info": meta_info(job, lookup, i + 1, last),
        }),
    }
}
