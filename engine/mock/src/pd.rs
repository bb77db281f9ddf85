//! Prefill/decode roles, the way SGLang's disaggregation pairs engines.
//!
//! The router sends the same body to a prefill and a decode engine, with
//! `bootstrap_host`, `bootstrap_port` and `bootstrap_room` (arrays for a batch). The
//! prefill engine computes the prompt (its prefix cache is where affinity pays) and
//! publishes the KV under the room on its bootstrap server. The decode engine fetches
//! the room from `bootstrap_host:bootstrap_port` and only then generates; a room that
//! never arrives fails the decode after `--kv-wait-ms`, as a real decode engine gives
//! up on KV that never comes. So a mock pair meets only if the router told both the
//! same room and the decode the right prefill's address.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Published rooms older than this are dropped (their decode never came).
const ROOM_TTL: Duration = Duration::from_secs(120);

/// What a prefill engine hands the decode engine of the same room: the KV, here its
/// accounting, so the decode reports the prefill's cache hit to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub room: u64,
    pub prefill_worker: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
}

impl Transfer {
    fn to_json(&self) -> Value {
        json!({
            "room": self.room,
            "prefill_worker": self.prefill_worker,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
        })
    }

    fn from_json(v: &Value) -> Option<Transfer> {
        Some(Transfer {
            room: v.get("room")?.as_u64()?,
            prefill_worker: v.get("prefill_worker")?.as_str()?.to_string(),
            prompt_tokens: usize::try_from(v.get("prompt_tokens")?.as_u64()?).ok()?,
            cached_tokens: usize::try_from(v.get("cached_tokens")?.as_u64()?).ok()?,
        })
    }
}

/// A prefill engine's published rooms, each taken once by its decode engine.
#[derive(Debug, Default)]
pub struct Rooms {
    ready: Mutex<HashMap<u64, (Transfer, Instant)>>,
    published: Notify,
}

impl Rooms {
    pub fn publish(&self, t: Transfer) {
        {
            let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
            ready.retain(|_, (_, at)| at.elapsed() < ROOM_TTL);
            ready.insert(t.room, (t, Instant::now()));
        }
        self.published.notify_waiters();
    }

    /// Takes `room`, waiting up to `wait` for it to be published.
    pub async fn take(&self, room: u64, wait: Duration) -> Option<Transfer> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register interest before looking, so a publish in between is not missed.
            let notified = self.published.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((t, _)) = ready.remove(&room) {
                    return Some(t);
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// Where one prompt's KV is: the prefill engine's bootstrap server and the room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub host: String,
    pub port: u16,
    pub room: u64,
}

/// The bootstrap fields of a body: one entry per prompt (scalars for one prompt,
/// arrays of equal length for a batch).
pub fn bootstrap_of(body: &Value) -> Result<Vec<Bootstrap>, String> {
    let field = |name: &str| -> Result<Vec<Value>, String> {
        match body.get(name) {
            None | Some(Value::Null) => Err(format!("missing `{name}` (a PD engine needs it)")),
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(v) => Ok(vec![v.clone()]),
        }
    };
    let (hosts, ports, rooms) = (
        field("bootstrap_host")?,
        field("bootstrap_port")?,
        field("bootstrap_room")?,
    );
    if hosts.len() != rooms.len() || ports.len() != rooms.len() || rooms.is_empty() {
        return Err("bootstrap_host, bootstrap_port and bootstrap_room differ in length".into());
    }
    hosts
        .iter()
        .zip(&ports)
        .zip(&rooms)
        .map(|((h, p), r)| {
            Ok(Bootstrap {
                host: h
                    .as_str()
                    .ok_or("`bootstrap_host` must be a string")?
                    .to_string(),
                port: p
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .ok_or("`bootstrap_port` must be a port number")?,
                room: r
                    .as_u64()
                    .filter(|r| *r < 1 << 63)
                    .ok_or("`bootstrap_room` must be an integer in [0, 2^63-1]")?,
            })
        })
        .collect()
}

/// The bootstrap server of a prefill engine: `GET /kv/<room>?wait_ms=N` answers the
/// room's transfer once published, or 404 after the wait.
pub async fn bootstrap_handle(rooms: Arc<Rooms>, req: Request<Incoming>) -> Response<String> {
    let path = req.uri().path();
    let wait_ms = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("wait_ms=")))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let Some(room) = path
        .strip_prefix("/kv/")
        .and_then(|r| r.parse::<u64>().ok())
    else {
        return reply(StatusCode::NOT_FOUND, json!({"error": "no such endpoint"}));
    };
    match rooms.take(room, Duration::from_millis(wait_ms)).await {
        Some(t) => reply(StatusCode::OK, t.to_json()),
        None => reply(
            StatusCode::NOT_FOUND,
            json!({"error": format!("room {room} was not prefilled here")}),
        ),
    }
}

fn reply(status: StatusCode, body: Value) -> Response<String> {
    let mut resp = Response::new(body.to_string());
    *resp.status_mut() = status;
    resp
}

/// Fetches the KV of `b` from its prefill engine, waiting up to `wait` for the
/// prefill to finish.
pub async fn fetch(b: &Bootstrap, wait: Duration) -> Result<Transfer, String> {
    let uri = format!(
        "http://{}:{}/kv/{}?wait_ms={}",
        b.host,
        b.port,
        b.room,
        wait.as_millis()
    );
    let fail = |why: String| format!("KV for room {} from {}:{}: {why}", b.room, b.host, b.port);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let uri: hyper::Uri = uri.parse().map_err(|e| fail(format!("{e}")))?;
    // The server waits `wait`; allow the round trip on top.
    let resp = tokio::time::timeout(wait + Duration::from_secs(5), client.get(uri))
        .await
        .map_err(|_| fail("bootstrap server did not answer".into()))?
        .map_err(|e| fail(format!("{e}")))?;
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|e| fail(format!("{e}")))?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(fail(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    serde_json::from_slice::<Value>(&body)
        .ok()
        .as_ref()
        .and_then(Transfer::from_json)
        .ok_or_else(|| fail("unreadable transfer".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_fields_scalar_and_batch() {
        let one =
            bootstrap_of(&json!({"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":7}))
                .unwrap();
        assert_eq!(
            one,
            [Bootstrap {
                host: "h".into(),
                port: 8998,
                room: 7
            }]
        );
        let batch = bootstrap_of(&json!({
            "bootstrap_host":["h","h"],"bootstrap_port":[1,1],"bootstrap_room":[1,2]
        }))
        .unwrap();
        assert_eq!(batch.len(), 2);
        for bad in [
            json!({}),
            json!({"bootstrap_host":"h","bootstrap_port":1}),
            json!({"bootstrap_host":"h","bootstrap_port":70000,"bootstrap_room":1}),
            json!({"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":-1}),
            json!({"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":u64::MAX}),
            json!({"bootstrap_host":["h"],"bootstrap_port":[1],"bootstrap_room":[1,2]}),
        ] {
            assert!(bootstrap_of(&bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_room_is_taken_once_whenever_it_is_published() {
        let rooms = Arc::new(Rooms::default());
        let t = Transfer {
            room: 5,
            prefill_worker: "p0".into(),
            prompt_tokens: 10,
            cached_tokens: 4,
        };
        let waiter = {
            let rooms = rooms.clone();
            tokio::spawn(async move { rooms.take(5, Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        rooms.publish(t.clone());
        assert_eq!(waiter.await.unwrap(), Some(t.clone()));
        assert_eq!(rooms.take(5, Duration::ZERO).await, None, "taken once");
        rooms.publish(t.clone());
        assert_eq!(rooms.take(5, Duration::ZERO).await, Some(t));
        assert_eq!(rooms.take(6, Duration::from_millis(20)).await, None);
    }
}
