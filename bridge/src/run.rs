//! The bridge's tasks: export (filter -> bus), import (bus -> filter), catch-up
//! (ask peers on every connection, answer theirs) and the optional /metrics server.
//! Every failure is counted and logged on its transition, and the loops carry on:
//! the filter routes on its own state whatever happens here.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::{Client, Event};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::cli::Settings;
use crate::envelope::{Kind, Refusal, Stamp};
use crate::envoy::Envoy;
use crate::fleet::{boot_nonce, now_ms, Admitted, Gate, Sealer};
use crate::retained::Retained;
use crate::stats::Stats;

/// A publish that takes longer than this counts as failed (it is retried).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

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

/// What every task needs: the settings, the bus, the filter, the counters and this
/// run's seal.
#[derive(Clone)]
struct Ctx {
    s: Settings,
    client: Client,
    envoy: Envoy,
    stats: Arc<Stats>,
    sealer: Arc<Sealer>,
    boot: u64,
}

impl Ctx {
    fn gate(&self) -> Gate {
        Gate::new(
            self.s.fleet_key.clone(),
            &self.s.replica,
            self.boot,
            self.s.max_message_age_ms,
        )
    }
}

pub async fn run(s: Settings) -> anyhow::Result<()> {
    let stats = Arc::new(Stats::default());
    let boot = boot_nonce()?;
    let (connected_tx, connected_rx) = mpsc::unbounded_channel();
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let events = stats.clone();
    // Set while connection attempts fail, so a run of failures is logged once.
    let failing = Arc::new(AtomicBool::new(false));
    let client = crate::bus::options(&s)?
        .event_callback(move |event| {
            let stats = events.clone();
            let tx = connected_tx.clone();
            let fatal = fatal_tx.clone();
            let failing = failing.clone();
            async move {
                if let Some(why) = crate::bus::fatal(&event) {
                    let _ = fatal.send(why);
                    return;
                }
                match event {
                    Event::Connected => {
                        failing.store(false, Ordering::Relaxed);
                        stats.bus_connected.store(1, Ordering::Relaxed);
                        tracing::info!("bus connected");
                        let _ = tx.send(());
                    }
                    Event::ClientError(e) => {
                        Stats::inc(&stats.connect_failures);
                        if !failing.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                "bus: cannot connect ({e}); retrying 100 ms to 1 s apart. \
                                 RUST_LOG=async_nats::connector=debug shows the cause \
                                 (e.g. a server certificate no --nats-ca signs)"
                            );
                        }
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
    if s.fleet_key.is_empty() {
        tracing::warn!(
            "--insecure-no-fleet-key: anyone who can publish on the bus can change this replica's routing"
        );
    }
    let envoy = Envoy::new(&s.envoy_url, &s.token);
    let retained = Arc::new(Mutex::new(Retained::new(s.retain_bytes)));
    let ops_subject = format!("{}.ops", s.prefix);
    let catchup_subject = format!("{}.catchup", s.prefix);
    let ops = client.subscribe(ops_subject.clone()).await?;
    let asks = client.subscribe(catchup_subject.clone()).await?;
    tracing::info!(replica = %s.replica, nats = %s.nats, envoy = %s.envoy_url, "bridge started");
    // The one stdout line: supervisors (and the demo) wait for it.
    println!("llm-bridge started (replica {})", s.replica);
    let ctx = Ctx {
        sealer: Arc::new(Sealer::new(s.fleet_key.clone(), &s.replica, boot)),
        s,
        client,
        envoy,
        stats: stats.clone(),
        boot,
    };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(export_loop(ctx.clone(), retained.clone(), ops_subject));
    tasks.spawn(import_loop(ctx.clone(), ops));
    tasks.spawn(answer_catchups(ctx.clone(), asks, retained));
    tasks.spawn(catch_up_on_connect(
        ctx.clone(),
        connected_rx,
        catchup_subject,
    ));
    if let Some(addr) = ctx.s.listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, "serving /metrics");
        tasks.spawn(serve_metrics(listener, stats));
    }
    tokio::select! {
        // The loops end only if the client is gone.
        _ = tasks.join_next() => anyhow::bail!("a bridge task ended"),
        Some(why) = fatal_rx.recv() => anyhow::bail!(why),
    }
}

async fn export_loop(ctx: Ctx, retained: Arc<Mutex<Retained>>, subject: String) {
    let Ctx {
        s,
        client,
        envoy,
        stats,
        sealer,
        ..
    } = ctx;
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
        // Sealed afresh on every attempt: a retry is a new message, not a replay.
        let (_, sealed) = sealer.seal(Kind::Ops, Stamp::default(), &batch.body, now_ms());
        let sent =
            tokio::time::timeout(PUBLISH_TIMEOUT, client.publish(subject.clone(), sealed)).await;
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

/// Every peer batch that passes the fleet gate goes into the filter, in arrival order.
async fn import_loop(ctx: Ctx, mut ops: async_nats::Subscriber) {
    let mut gate = ctx.gate();
    let mut filter = Transition::new("import into the filter");
    while let Some(msg) = ops.next().await {
        let (from, batch) = match gate.admit(&msg.payload, Kind::Ops, now_ms()) {
            Ok(Admitted::Peer(h, batch)) => (h.sender, batch),
            Ok(Admitted::Own) => continue,
            Err(r) => {
                ctx.stats.refuse(r, &msg.subject);
                continue;
            }
        };
        match ctx.envoy.import(&from, false, batch).await {
            Ok(()) => {
                filter.ok();
                Stats::inc(&ctx.stats.batches_imported);
            }
            Err(e) => {
                Stats::inc(&ctx.stats.import_failures);
                filter.failed(&e);
            }
        }
    }
}

/// A peer asks for what this replica published recently: send it, oldest first,
/// to the inbox the (authenticated) ask names, each answer naming the ask.
async fn answer_catchups(
    ctx: Ctx,
    mut asks: async_nats::Subscriber,
    retained: Arc<Mutex<Retained>>,
) {
    let mut gate = ctx.gate();
    while let Some(msg) = asks.next().await {
        let (ask, inbox) = match gate.admit(&msg.payload, Kind::Ask, now_ms()) {
            Ok(Admitted::Peer(h, inbox)) => (h.stamp, inbox),
            Ok(Admitted::Own) => continue,
            Err(r) => {
                ctx.stats.refuse(r, &msg.subject);
                continue;
            }
        };
        let Some(inbox) = std::str::from_utf8(&inbox)
            .ok()
            .filter(|i| !i.is_empty() && !i.contains([' ', '*', '>']))
        else {
            ctx.stats.refuse(Refusal::Malformed, &msg.subject);
            continue;
        };
        let batches: Vec<Bytes> = retained.lock().map(|r| r.snapshot()).unwrap_or_default();
        for b in batches {
            let (_, sealed) = ctx.sealer.seal(Kind::Answer, ask, &b, now_ms());
            let sent = tokio::time::timeout(
                PUBLISH_TIMEOUT,
                ctx.client.publish(inbox.to_string(), sealed),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                break;
            }
        }
        Stats::inc(&ctx.stats.catchup_answers);
    }
}

/// On every (re)connection: ask the peers for their recent batches and replay
/// them into the filter for `--catchup-ms`. Only answers to this very ask pass.
async fn catch_up_on_connect(
    ctx: Ctx,
    mut connected: mpsc::UnboundedReceiver<()>,
    subject: String,
) {
    while connected.recv().await.is_some() {
        let inbox = ctx.client.new_inbox();
        let Ok(mut answers) = ctx.client.subscribe(inbox.clone()).await else {
            continue;
        };
        Stats::inc(&ctx.stats.catchup_requests);
        let (ask, sealed) =
            ctx.sealer
                .seal(Kind::Ask, Stamp::default(), inbox.as_bytes(), now_ms());
        if let Err(e) = ctx.client.publish(subject.clone(), sealed).await {
            tracing::warn!("catch-up request not sent: {e}");
            continue;
        }
        let mut gate = ctx.gate();
        let deadline = tokio::time::Instant::now() + ctx.s.catchup;
        let mut replayed = 0u64;
        while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, answers.next()).await {
            let (from, batch) = match gate.admit(&msg.payload, Kind::Answer, now_ms()) {
                Ok(Admitted::Peer(h, batch)) if h.reply_to == ask => (h.sender, batch),
                Ok(Admitted::Peer(..)) => {
                    ctx.stats.refuse(Refusal::Replayed, &msg.subject);
                    continue;
                }
                Ok(Admitted::Own) => continue,
                Err(r) => {
                    ctx.stats.refuse(r, &msg.subject);
                    continue;
                }
            };
            match ctx.envoy.import(&from, true, batch).await {
                Ok(()) => {
                    replayed += 1;
                    Stats::inc(&ctx.stats.catchup_batches);
                }
                Err(e) => {
                    Stats::inc(&ctx.stats.import_failures);
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
