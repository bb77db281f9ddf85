//! The routing VM's answer to a question: where the request goes, with what
//! undoes its tree records, or the local reply the client gets.

use super::{item_count, TAG_REFUSED, TAG_ROUTED};
use crate::config::Pool;
use crate::decision::{Decision, GateAudit, Prediction, Reason};
use crate::shared::{pool_code, pool_of, put_bytes, put_varint, Reader};

/// The router's answer for the stream `ctx` of the VM that asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub ctx: u32,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Routed(Routed),
    /// The client gets a local reply.
    Refused(Refused),
}

/// Where the request goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// The worker that gets the request itself (regular, or decode in PD).
    pub main: Decision,
    pub main_worker: String,
    /// PD with a body: the prefill worker and the body both engines get.
    pub prefill: Option<(Decision, String, Vec<u8>)>,
    /// The body had a routing text and is small enough that a failure after it
    /// is judged the engine's (`health.judged_body_bytes`).
    pub judged: bool,
    /// Chars of the routing text, which the asking VM counts the request with.
    pub text_chars: u64,
    /// What undoes each tree record if no engine serves the request.
    pub records: Vec<RecordMeta>,
}

/// One record of the router's: an insert of the request's routing text under
/// `worker` in `pool`'s tree, applied at the clock `seq`, the worker holding
/// `keep_chars` of the text before. The asking VM undoes it with a `Forget` it
/// shares in the ring, the text read again from the body it kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta {
    pub pool: Pool,
    pub worker: String,
    pub keep_chars: u64,
    pub seq: u64,
}

/// A local reply's status, reason (`x-llm-router-reason`) and message detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u32,
    pub reason: String,
    pub detail: Option<String>,
}

impl Answer {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match &self.verdict {
            Verdict::Routed(r) => {
                out.push(TAG_ROUTED);
                out.extend_from_slice(&self.ctx.to_le_bytes());
                put_decision(&mut out, &r.main);
                put_bytes(&mut out, r.main_worker.as_bytes());
                out.push(u8::from(r.judged));
                put_varint(&mut out, r.text_chars);
                put_varint(&mut out, r.records.len() as u64);
                for m in &r.records {
                    out.push(pool_code(m.pool));
                    put_bytes(&mut out, m.worker.as_bytes());
                    put_varint(&mut out, m.keep_chars);
                    put_varint(&mut out, m.seq);
                }
                // Last: the prefill body is the rest.
                if let Some((d, worker, body)) = &r.prefill {
                    put_decision(&mut out, d);
                    put_bytes(&mut out, worker.as_bytes());
                    out.extend_from_slice(body);
                }
            }
            Verdict::Refused(f) => {
                out.push(TAG_REFUSED);
                out.extend_from_slice(&self.ctx.to_le_bytes());
                out.extend_from_slice(&f.status.to_le_bytes());
                put_bytes(&mut out, f.reason.as_bytes());
                if let Some(d) = &f.detail {
                    put_bytes(&mut out, d.as_bytes());
                }
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Answer> {
        let mut r = Reader(bytes);
        let tag = r.u8()?;
        let ctx = r.u32()?;
        let verdict = match tag {
            TAG_ROUTED => {
                let main = decision(&mut r)?;
                let main_worker = r.string()?;
                let judged = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let text_chars = r.varint()?;
                // Each record takes at least 7 bytes.
                let n = item_count(&mut r, 7)?;
                let mut records = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    records.push(RecordMeta {
                        pool: pool_of(r.u8()?)?,
                        worker: r.string()?,
                        keep_chars: r.varint()?,
                        seq: r.varint()?,
                    });
                }
                let prefill = if r.0.is_empty() {
                    None
                } else {
                    let d = decision(&mut r)?;
                    let worker = r.string()?;
                    Some((d, worker, std::mem::take(&mut r.0).to_vec()))
                };
                Verdict::Routed(Routed {
                    main,
                    main_worker,
                    prefill,
                    judged,
                    text_chars,
                    records,
                })
            }
            TAG_REFUSED => {
                let status = r.u32()?;
                let reason = r.string()?;
                let detail = if r.0.is_empty() {
                    None
                } else {
                    Some(r.string()?)
                };
                if !r.0.is_empty() {
                    return None;
                }
                Verdict::Refused(Refused {
                    status,
                    reason,
                    detail,
                })
            }
            _ => return None,
        };
        Some(Answer { ctx, verdict })
    }
}

fn put_decision(out: &mut Vec<u8>, d: &Decision) {
    out.extend_from_slice(&d.worker.to_le_bytes());
    let reason = Reason::ALL.iter().position(|r| *r == d.reason).unwrap_or(0);
    out.push(reason as u8);
    put_varint(out, d.matched_chars as u64);
    put_varint(out, u64::from(d.gate.rejected));
    put_varint(out, u64::from(d.gate.unsampled));
    match d.predicted {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            put_varint(out, p.ttft_us);
            put_varint(out, p.uncached_chars);
            put_varint(out, p.ahead_chars);
        }
    }
}

fn decision(r: &mut Reader<'_>) -> Option<Decision> {
    let worker = r.u32()?;
    let reason = *Reason::ALL.get(usize::from(r.u8()?))?;
    let matched_chars = usize::try_from(r.varint()?).ok()?;
    let gate = GateAudit {
        rejected: u32::try_from(r.varint()?).ok()?,
        unsampled: u32::try_from(r.varint()?).ok()?,
    };
    let predicted = match r.u8()? {
        0 => None,
        1 => Some(Prediction {
            ttft_us: r.varint()?,
            uncached_chars: r.varint()?,
            ahead_chars: r.varint()?,
        }),
        _ => return None,
    };
    Some(Decision {
        worker,
        reason,
        matched_chars,
        gate,
        predicted,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Ask, TAG_ASK};
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn d(worker: u32, reason: Reason, predicted: Option<Prediction>) -> Decision {
        Decision {
            worker,
            reason,
            matched_chars: 4_000,
            gate: GateAudit {
                rejected: 2,
                unsampled: 1,
            },
            predicted,
        }
    }

    #[test]
    fn every_reason_and_a_prediction_round_trip() {
        let p = Prediction {
            ttft_us: 12_345,
            uncached_chars: 900,
            ahead_chars: 1 << 40,
        };
        for (i, reason) in Reason::ALL.iter().enumerate() {
            let predicted = (i % 2 == 0).then_some(p);
            let routed = Routed {
                main: d(i as u32, *reason, predicted),
                main_worker: format!("w{i}"),
                prefill: None,
                judged: i % 3 == 0,
                text_chars: i as u64 * 1000,
                records: vec![],
            };
            let a = Answer {
                ctx: i as u32,
                verdict: Verdict::Routed(routed),
            };
            assert_eq!(Answer::decode(&a.encode()), Some(a));
        }
    }

    #[test]
    fn a_pd_answer_round_trips_with_its_records_and_body() {
        let a = Answer {
            ctx: 9,
            verdict: Verdict::Routed(Routed {
                main: d(1, Reason::CacheHit, None),
                main_worker: "decode-1".into(),
                prefill: Some((
                    d(0, Reason::CacheMiss, None),
                    "prefill-0".into(),
                    br#"{"bootstrap_room":7}"#.to_vec(),
                )),
                judged: true,
                text_chars: 12_000,
                records: vec![
                    RecordMeta {
                        pool: Pool::Prefill,
                        worker: "prefill-0".into(),
                        keep_chars: 0,
                        seq: 41,
                    },
                    RecordMeta {
                        pool: Pool::Decode,
                        worker: "decode-1".into(),
                        keep_chars: 300,
                        seq: 41,
                    },
                ],
            }),
        };
        assert_eq!(Answer::decode(&a.encode()), Some(a));
    }

    #[test]
    fn a_refusal_round_trips_with_and_without_detail() {
        for detail in [None, Some("messages[3] must be an object".to_string())] {
            let a = Answer {
                ctx: 4,
                verdict: Verdict::Refused(Refused {
                    status: 400,
                    reason: "invalid_body".into(),
                    detail,
                }),
            };
            assert_eq!(Answer::decode(&a.encode()), Some(a));
        }
    }

    #[test]
    fn damaged_messages_are_refused_not_misread() {
        let a = Answer {
            ctx: 1,
            verdict: Verdict::Routed(Routed {
                main: d(0, Reason::CacheHit, None),
                main_worker: "w".into(),
                prefill: None,
                judged: false,
                text_chars: 5,
                records: vec![RecordMeta {
                    pool: Pool::Regular,
                    worker: "w".into(),
                    keep_chars: 1,
                    seq: 2,
                }],
            }),
        };
        let bytes = a.encode();
        // Every cut short of the whole is refused (a routed answer without a
        // prefill ends with its records).
        for n in 0..bytes.len() {
            assert_eq!(Answer::decode(&bytes[..n]), None, "cut at {n}");
        }
        let mut bad_tag = bytes.clone();
        bad_tag[0] = 99;
        assert_eq!(Answer::decode(&bad_tag), None);
        assert_eq!(Ask::decode(&bytes), None);
        assert_eq!(Ask::decode(&[TAG_ASK, 0, 0]), None);
        // A record count no body could hold.
        let mut lying = vec![TAG_ROUTED, 1, 0, 0, 0];
        put_decision(&mut lying, &d(0, Reason::CacheHit, None));
        put_bytes(&mut lying, b"w");
        lying.push(0);
        put_varint(&mut lying, 5);
        put_varint(&mut lying, u64::MAX);
        assert_eq!(Answer::decode(&lying), None);
    }
}
