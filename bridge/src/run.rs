//! The bridge's tasks: export (filter -> bus), import (bus -> filter), catch-up
//! (ask peers on every connection, answer theirs) and the optional /metrics server.
//! Every failure is counted and logged on its transition, and the loops carry on:
//! the filter routes on its own state whatever happens here.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::{Client, ConnectOptions, Event, HeaderMap, Message};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::cli::Settings;
use crate::envoy::Envoy;
use crate::retained::Retained;
use crate::stats::Stats;

/// The header naming the replica a batch comes from.
pub const REPLICA_HEADER: &str = "llm-router-replica";
/// A publish that takes longer than this counts as failed (it is retried).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
/// Reconnection attempts back off to at most this.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

fn headers(replica: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(REPLICA_HEADER, replica);
    h
}

/// The replica a message comes from, unless it is ours or unnamed.
fn peer_of(msg: &Message, me: &str) -> Option<String> {
    let from = msg.headers.as_ref()?.get(REPLICA_HEADER)?.as_str();
    (from != me && !from.is_empty()).then(|| from.to_string())
}

/// Logs a failure when a run of them starts and when it ends, not every time.
struct Transition {
    what: &'static str,
    failing: bool,
}

impl Transition {
    fn new(what: &'static str) -> Transition {
        Transition {
            what,
            failing: false,
        }
    }
    fn failed(&mut self, e: &str) {
        if !std::mem::replace(&mut self.failing, true) {
            tracing::warn!("{} failing: {e}", self.what);
        }
    }
    fn ok(&mut self) {
        if std::mem::replace(&mut self.failing, false) {
            tracing::info!("{} working again", self.what);
        }
    }
}

pub async fn run(s: Settings) -> anyhow::Result<()> {
    let stats = Arc::new(Stats::default());
    let (connected_tx, connected_rx) = mpsc::unbounded_channel();
    let events = stats.clone();
    let client = ConnectOptions::new()
        .name(format!("llm-bridge {}", s.replica))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            (Duration::from_millis(100) * attempts as u32).min(MAX_RECONNECT_DELAY)
        })
        .event_callback(move |event| {
            let stats = events.clone();
            let tx = connected_tx.clone();
            async move {
                match event {
                    Event::Connected => {
                        stats.bus_connected.store(1, Ordering::Relaxed);
                        tracing::info!("bus connected");
                        let _ = tx.send(());
                    }
                    Event::Disconnected => {
                        stats.bus_connected.store(0, Ordering::Relaxed);
                        Stats::inc(&stats.bus_disconnects);
                        tracing::warn!(
                            "bus disconnected: routing goes on with local state; reconnecting"
                        );
                    }
                    other => tracing::warn!("bus: {other}"),
                }
            }
        })
        .connect(s.nats.as_str())
        .await?;
    let envoy = Envoy::new(&s.envoy_url, &s.token);
    let retained = Arc::new(Mutex::new(Retained::new(s.retain_bytes)));
    let ops_subject = format!("{}.ops", s.prefix);
    let catchup_subject = format!("{}.catchup", s.prefix);
    let ops = client.subscribe(ops_subject.clone()).await?;
    let asks = client.subscribe(catchup_subject.clone()).await?;
    tracing::info!(replica = %s.replica, nats = %s.nats, envoy = %s.envoy_url, "bridge started");
    // The one stdout line: supervisors (and the demo) wait for it.
    println!("llm-bridge started (replica {})", s.replica);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(export_loop(
        s.clone(),
        client.clone(),
        envoy.clone(),
        stats.clone(),
        retained.clone(),
        ops_subject,
    ));
    tasks.spawn(import_loop(
        s.replica.clone(),
        ops,
        envoy.clone(),
        stats.clone(),
    ));
    tasks.spawn(answer_catchups(
        s.replica.clone(),
        client.clone(),
        asks,
        retained,
        stats.clone(),
    ));
    tasks.spawn(catch_up_on_connect(
        s.clone(),
        client,
        envoy,
        stats.clone(),
        connected_rx,
        catchup_subject,
    ));
    if let Some(addr) = s.listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, "serving /metrics");
        tasks.spawn(serve_metrics(listener, stats));
    }
    // The loops end only if the client is gone.
    tasks.join_next().await;
    anyhow::bail!("a bridge task ended")
}

async fn export_loop(
    s: Settings,
    client: Client,
    envoy: Envoy,
    stats: Arc<Stats>,
    retained: Arc<Mutex<Retained>>,
    subject: String,
) {
    let mut cursor = 0u64;
    let mut last_publish: Option<Instant> = None;
    let mut filter = Transition::new("export from the filter");
    let mut bus = Transition::new("publishing");
    loop {
        // While the bus is down the operations stay in the ring: held, not lost.
        if client.connection_state() != State::Connected {
            Stats::inc(&stats.polls_held);
            tokio::time::sleep(s.poll).await;
            continue;
        }
        let batch = match envoy.export(cursor).await {
            Ok(b) => {
                filter.ok();
                b
            }
            Err(e) => {
                Stats::inc(&stats.export_failures);
                filter.failed(&e);
                tokio::time::sleep(s.poll).await;
                continue;
            }
        };
        let load_due = last_publish.is_none_or(|t| t.elapsed() >= s.load);
        if batch.ops == 0 && !load_due {
            cursor = batch.next;
            tokio::time::sleep(s.poll).await;
            continue;
        }
        let sent = tokio::time::timeout(
            PUBLISH_TIMEOUT,
            client.publish_with_headers(subject.clone(), headers(&s.replica), batch.body.clone()),
        )
        .await;
        match sent {
            Ok(Ok(())) => {
                bus.ok();
                cursor = batch.next;
                last_publish = Some(Instant::now());
                Stats::inc(&stats.batches_published);
                stats
                    .ops_published
                    .fetch_add(batch.ops as u64, Ordering::Relaxed);
                if batch.ops > 0 {
                    if let Ok(mut r) = retained.lock() {
                        r.push(batch.body);
                    }
                    // A full batch may have more behind it: ask again at once.
                    continue;
                }
            }
            Ok(Err(e)) => {
                Stats::inc(&stats.publish_failures);
                bus.failed(&e.to_string());
            }
            Err(_) => {
                Stats::inc(&stats.publish_failures);
                bus.failed("publish timed out");
            }
        }
        tokio::time::sleep(s.poll).await;
    }
}

async fn import_loop(me: String, mut ops: async_nats::Subscriber, envoy: Envoy, stats: Arc<Stats>) {
    let mut filter = Transition::new("import into the filter");
    while let Some(msg) = ops.next().await {
        let Some(from) = peer_of(&msg, &me) else {
            continue;
        };
        match envoy.import(&from, false, msg.payload).await {
            Ok(()) => {
                filter.ok();
                Stats::inc(&stats.batches_imported);
            }
            Err(e) => {
                Stats::inc(&stats.import_failures);
                filter.failed(&e);
            }
        }
    }
}

/// A peer asks for what this replica published recently: send it, oldest first.
async fn answer_catchups(
    me: String,
    client: Client,
    mut asks: async_nats::Subscriber,
    retained: Arc<Mutex<Retained>>,
    stats: Arc<Stats>,
) {
    while let Some(ask) = asks.next().await {
        let (Some(reply), Some(_)) = (ask.reply.clone(), peer_of(&ask, &me)) else {
            continue;
        };
        let batches: Vec<Bytes> = retained.lock().map(|r| r.snapshot()).unwrap_or_default();
        for b in batches {
            let sent = tokio::time::timeout(
                PUBLISH_TIMEOUT,
                client.publish_with_headers(reply.clone(), headers(&me), b),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                break;
            }
        }
        Stats::inc(&stats.catchup_answers);
    }
}

/// On every (re)connection: ask the peers for their recent batches and replay
/// them into the filter for `--catchup-ms`.
async fn catch_up_on_connect(
    s: Settings,
    client: Client,
    envoy: Envoy,
    stats: Arc<Stats>,
    mut connected: mpsc::UnboundedReceiver<()>,
    subject: String,
) {
    while connected.recv().await.is_some() {
        let inbox = client.new_inbox();
        let Ok(mut answers) = client.subscribe(inbox.clone()).await else {
            continue;
        };
        Stats::inc(&stats.catchup_requests);
        let asked = client
            .publish_with_reply_and_headers(
                subject.clone(),
                inbox,
                headers(&s.replica),
                Bytes::new(),
            )
            .await;
        if let Err(e) = asked {
            tracing::warn!("catch-up request not sent: {e}");
            continue;
        }
        let deadline = tokio::time::Instant::now() + s.catchup;
        let mut replayed = 0u64;
        while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, answers.next()).await {
            let Some(from) = peer_of(&msg, &s.replica) else {
                continue;
            };
            match envoy.import(&from, true, msg.payload).await {
                Ok(()) => {
                    replayed += 1;
                    Stats::inc(&stats.catchup_batches);
                }
                Err(e) => {
                    Stats::inc(&stats.import_failures);
                    tracing::warn!("catch-up batch from {from} not taken: {e}");
                }
            }
        }
        let _ = answers.unsubscribe().await;
        tracing::info!(batches = replayed, "caught up with peers");
    }
}

async fn serve_metrics(listener: tokio::net::TcpListener, stats: Arc<Stats>) {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let stats = stats.clone();
                async move {
                    let (status, body) = match req.uri().path() {
                        "/metrics" => (200, stats.render()),
                        "/healthz" => (200, "ok\n".to_string()),
                        _ => (404, "not found\n".to_string()),
                    };
                    let mut resp = hyper::Response::new(Full::new(Bytes::from(body)));
                    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
                    Ok::<_, Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
