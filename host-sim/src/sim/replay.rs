//! Replaying a workload through the filter against a [`SimFleet`], in virtual time.
//!
//! The load tool's rules, with the clock virtual: requests go in `llm-load`'s order
//! ([`llm_load::scheduler::Dispatch`]: sessions in turn order, earliest line first)
//! with at most `concurrency` in flight, round robin over the VMs (Envoy's worker
//! threads); those sent at the same instant (a run's first `concurrency`) reach the
//! filter in an order drawn from `arrival_seed` (by default the config's `rng_seed`), as concurrent connections
//! reach Envoy in no fixed order; each routed request is served by the engine the filter chose, which
//! answers when its cost model says; the filter sees the response and the end of the
//! stream at that time. HTTP calls the filter makes to an engine's cluster (a prefill
//! copy, an overload probe) are served by that engine the same way. Before the first
//! request and every `collector_interval_ms` after it the fleet's gauges are pushed
//! to the filter's stats endpoint, as the companion collector does. What comes out
//! is the load tool's [`Summary`] (latencies in virtual ms), so the report is the
//! demo's.
//!
//! At concurrency 1 every decision of a policy that does not read time
//! (`cache_aware`) is a pure function of the workload, the config and its
//! `rng_seed`, which is what makes a run comparable with `envoy/demo --concurrency 1`
//! request for request; `predicted_ttft` learns from the (virtual) times it
//! measures.

use super::fleet::SimFleet;
use super::sweep::Decode;
use crate::{FailurePolicy, Filter, Host, RequestSpec, StreamHandle, StreamOutcome};
use anyhow::{bail, Context as _, Result};
use engine_model::engine::{Engine, EngineSpec};
use llm_load::record::Record;
use llm_load::response::{parse_json_body, snippet};
use llm_load::scheduler::Dispatch;
use llm_load::stats::{summarize, Summary};
use llm_load::workload::WorkItem;
use llm_router::rng::{Rng as _, SplitMix64};
use llm_router::support::header_names::EXPLAIN_HEADER;
use serde_json::{json, Value};
use std::time::Duration;

/// Domain tag of the arrival-order draws (the filter's own draws use its seed as is).
const ARRIVAL_STREAM: u64 = 0xA771;

/// Fisher-Yates: `items` in an order drawn from `rng`.
fn shuffle(items: &mut [usize], rng: &mut SplitMix64) {
    for k in (1..items.len()).rev() {
        items.swap(k, rng.below(k + 1));
    }
}

/// Virtual time between the last answer and reading the stats: more than a sync tick.
const SETTLE_MS: f64 = 1_000.0;
/// The stats push token replay configures when the config has none.
const STATS_TOKEN: &str = "host-sim-replay";

/// How to replay.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Engines in the fleet (`--workers`).
    pub workers: usize,
    /// Prefill/decode disaggregation: this many prefill and decode engines (`p0..`,
    /// `d0..`) instead of `workers` regular ones (`--pd`).
    pub pd: Option<(usize, usize)>,
    /// VMs, i.e. Envoy worker threads (`--envoy-concurrency` of the demo).
    pub vms: usize,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Every engine's shape...
    pub engine: EngineSpec,
    /// ...but engine `i`'s is `engine_specs[i]` where given: a heterogeneous fleet (a
    /// slower engine, a smaller cache), as engine mocks started with their own flags.
    pub engine_specs: Vec<EngineSpec>,
    /// Push the fleet's gauges this often (virtual ms); `None`: no collector.
    pub collector_interval_ms: Option<u64>,
    /// The seed of the order in which requests sent at the same instant reach the
    /// filter; `None`: the config's `rng_seed`, so one seed stands for a run. Set
    /// apart, the filter's own draws (its near-ties) change while its arrivals stay.
    pub arrival_seed: Option<u64>,
}

impl Replay {
    /// This replay with every engine waiting for a cached prefix another request is
    /// still prefilling, or not (`EngineSpec::prefix_wait`, `--no-prefix-wait`).
    pub fn prefix_wait(mut self, on: bool) -> Replay {
        self.engine.prefix_wait = on;
        for spec in &mut self.engine_specs {
            spec.prefix_wait = on;
        }
        self
    }

    /// This replay with every engine decoding as `decode` says.
    pub fn decode(mut self, decode: Decode) -> Replay {
        for spec in std::iter::once(&mut self.engine).chain(&mut self.engine_specs) {
            spec.latency.decode_ms_per_token = decode.ms_per_token;
            spec.output_tokens = decode.output_tokens;
        }
        self
    }
}

/// A finished replay: the summary, and the host and fleet as the run left them (for
/// metrics, logs, engine caches).
pub struct ReplayRun {
    pub summary: Summary,
    /// Every request's outcome, in workload order (kept by item index).
    pub records: Vec<Record>,
    pub host: Host,
    pub fleet: SimFleet,
}

/// A request the engine is working on.
struct InFlight {
    item: usize,
    handle: StreamHandle,
    dispatched_ms: f64,
    delivery: Delivery,
    done_ms: f64,
    status: u32,
    body: Vec<u8>,
    record: Record,
}

/// How an engine's answer reaches the filter. A streamed one comes as an engine
/// streams: the response headers and first bytes at the first token, the rest at
/// the end (a filter that took the whole answer's time for its first byte would
/// learn decode time as prefill).
#[derive(Clone, Copy, PartialEq)]
enum Delivery {
    /// All at once, at the end (not streamed, or nothing after the first token).
    Whole,
    /// Streamed, its first token due at this time.
    FirstAt(f64),
    /// Streamed, its first bytes delivered: the rest at the end.
    Rest,
}

impl InFlight {
    /// When the filter next hears from the engine.
    fn next_ms(&self) -> f64 {
        match self.delivery {
            Delivery::FirstAt(ms) => ms,
            Delivery::Whole | Delivery::Rest => self.done_ms,
        }
    }
}

/// The engine's response headers.
const RESPONSE_HEADERS: [(&str, &str); 1] = [("content-type", "application/json")];

/// Bytes of a streamed answer that reach the filter at its first token.
const FIRST_BYTES: usize = 1;

/// An HTTP call the filter made, being served by an engine.
struct Call {
    token: u32,
    done_ms: f64,
    status: u32,
    body: Vec<u8>,
}

/// The cluster `kv_match` asks in a replay: the fleet answers it as the collector
/// following every engine's KV events would, at once.
pub const KV_MATCH_CLUSTER: &str = "llm_collector";

/// Virtual time [`Calls::advance_to`] lets pass before it looks for new calls (so a
/// call made on a tick reaches its engine at most this late).
const CALL_STEP_MS: f64 = 10.0;

/// The HTTP calls the filter made to fleet engines (prefill copies, overload probes),
/// each served by its engine and answered when that engine is done, in virtual time.
#[derive(Default)]
pub struct Calls {
    calls: Vec<Call>,
}

impl Calls {
    /// Sends every new HTTP call the filter made to a fleet engine (a prefill copy, a
    /// probe) to that engine at `now`, to be answered when it is done; calls to other
    /// clusters are left to time out, as an unreachable cluster's would.
    pub fn schedule(&mut self, host: &Host, fleet: &mut SimFleet, now: f64) {
        for call in host.pending_http_calls() {
            if self.calls.iter().any(|c| c.token == call.token) {
                continue;
            }
            let path = call.header(":path").unwrap_or("/").to_string();
            let answer = match fleet.find(Some(&call.cluster), None) {
                Some(engine) => fleet.serve(engine, now, &path, &call.body),
                None if call.cluster == KV_MATCH_CLUSTER => fleet.kv_match(&path, &call.body),
                None => continue,
            };
            self.calls.push(Call {
                token: call.token,
                done_ms: answer.served.map_or(now, |s| s.finished_ms),
                status: answer.status,
                body: answer.body,
            });
        }
    }

    /// The call whose engine is done first, and when.
    fn next(&self) -> Option<(usize, f64)> {
        self.calls
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.done_ms.total_cmp(&b.1.done_ms))
            .map(|(k, c)| (k, c.done_ms))
    }

    /// Answers call `k` with its engine's answer, unless it is gone (its context
    /// ended, or it timed out: the host answered it already).
    fn answer(&mut self, host: &mut Host, k: usize) -> Result<()> {
        let call = self.calls.swap_remove(k);
        if host
            .pending_http_calls()
            .iter()
            .any(|c| c.token == call.token)
        {
            let headers = [("content-type", "application/json")];
            host.answer_http_call(call.token, call.status, &headers, &call.body)?;
        }
        Ok(())
    }

    /// Moves the clock to `until` ms after `start_ms` (never back), serving the calls
    /// the filter makes meanwhile: each is answered when its engine is done, or times
    /// out first when the engine is slower than the call's timeout.
    pub fn advance_to(
        &mut self,
        host: &mut Host,
        fleet: &mut SimFleet,
        start_ms: u64,
        until: f64,
    ) -> Result<()> {
        loop {
            let now = host.now_ms().saturating_sub(start_ms) as f64;
            self.schedule(host, fleet, now);
            let step_end = (now + CALL_STEP_MS).min(until);
            if let Some((k, at)) = self.next().filter(|&(_, at)| at <= step_end) {
                move_clock(host, start_ms, at)?;
                self.answer(host, k)?;
                continue;
            }
            if now >= until {
                return Ok(());
            }
            move_clock(host, start_ms, step_end)?;
        }
    }
}

/// What serving a request touches: the host, the fleet and the calls in flight.
type Sim<'a> = (&'a mut Host, &'a mut SimFleet, &'a mut Calls);

/// Where a request stands after the filter saw it.
enum Routed {
    Engine(InFlight),
    Held(Held),
    Done(Record),
}

/// A request the filter holds (neither sent upstream nor answered).
struct Held {
    item: usize,
    handle: StreamHandle,
    sent: f64,
}

/// What happens next: a stream's or a call's engine finishes.
enum Event {
    Stream(usize, f64),
    Call(usize, f64),
    /// The earliest HTTP call timeout (the host answers it with a 504).
    Timeout(f64),
}

impl Replay {
    /// The plugin config with the fleet's `workers`, `target: cluster` and, with a
    /// collector, a stats token filled in when absent (as the demo's fleet does).
    pub fn plugin_config(&self, fleet: &SimFleet, config: &Value) -> Result<Value> {
        let mut config = config.clone();
        let Value::Object(map) = &mut config else {
            bail!("the plugin config must be a JSON object");
        };
        map.entry("target").or_insert_with(|| json!("cluster"));
        // `kv_match: true` (or settings without a cluster) asks the simulated
        // collector, as the demo's fleet wires its own.
        match map.get_mut("kv_match") {
            Some(v @ Value::Bool(true)) => *v = json!({ "cluster": KV_MATCH_CLUSTER }),
            Some(Value::Object(s)) => {
                s.entry("cluster")
                    .or_insert_with(|| json!(KV_MATCH_CLUSTER));
            }
            _ => {}
        }
        map.entry("workers")
            .or_insert_with(|| fleet.workers_config());
        if self.collector_interval_ms.is_some() {
            map.entry("stats_token")
                .or_insert_with(|| json!(STATS_TOKEN));
        }
        Ok(config)
    }

    /// The simulated engines: the config's own `workers` when it lists them, else
    /// the demo's fleet (`w0..`, or `p0..`/`d0..` with PD).
    pub fn fleet(&self, config: &Value) -> Result<SimFleet> {
        let mut fleet = match (config.get("workers"), self.pd) {
            (Some(workers), _) => SimFleet::from_workers(workers, self.engine)
                .map_err(|e| anyhow::anyhow!("the plugin config's {e}"))?,
            (None, Some((prefill, decode))) => SimFleet::pd(prefill, decode, self.engine),
            (None, None) => SimFleet::demo(self.workers, self.engine),
        };
        for (e, spec) in fleet.engines.iter_mut().zip(&self.engine_specs) {
            e.engine = Engine::new(*spec);
        }
        Ok(fleet)
    }

    /// Runs `items` through `filter` with plugin config `config` (see
    /// [`Replay::plugin_config`]).
    pub fn run(&self, filter: &Filter, config: &Value, items: &[WorkItem]) -> Result<ReplayRun> {
        let mut fleet = self.fleet(config)?;
        let config = self.plugin_config(&fleet, config)?;
        let token = config["stats_token"].as_str().map(str::to_string);
        let stats_path = config["stats_path"]
            .as_str()
            .unwrap_or("/llm-router/stats")
            .to_string();
        let mut host = Host::builder_for(filter)
            .plugin_config(serde_json::to_vec(&config)?)
            .plugin_name("llm_router")
            .root_id("llm_router")
            // Envoy's main thread runs a VM too: it gets no traffic but ticks, so it
            // applies the tree's operations like the workers do.
            .vms(self.vms.max(1) + 1)
            .clusters(&[fleet.clusters(), vec![KV_MATCH_CLUSTER.to_string()]].concat())
            .allow_on_headers_stop_iteration(true)
            .failure_policy(FailurePolicy::FailReload)
            .build()
            .context("starting the filter")?;
        let start_ms = host.now_ms();
        let workers = self.vms.max(1);
        let sessions: Vec<Option<String>> = items.iter().map(|i| i.session.clone()).collect();
        let mut order = Dispatch::new(&sessions);
        let mut records: Vec<Option<Record>> = vec![None; items.len()];
        let mut in_flight: Vec<InFlight> = Vec::new();
        let mut calls = Calls::default();
        let mut held: Vec<Held> = Vec::new();
        let (mut now, mut sent, mut pushes) = (0.0f64, 0usize, 0usize);
        let interval = self.collector_interval_ms.filter(|&i| i > 0);
        let mut next_push = interval.map(|i| i as f64);
        // A deployed collector runs before traffic comes: its first push is in
        // before the first request, as `envoy/demo` waits for it.
        if let (Some(token), Some(_)) = (&token, interval) {
            push_stats(&mut host, &fleet, (start_ms, 0.0), (&stats_path, token), 0)?;
            pushes += 1;
        }
        // Requests sent at the same instant (a run's first `concurrency`, say) reach
        // Envoy in no fixed order: the load tool's tasks race, and so do Envoy's
        // connections. They reach the filter in an order drawn from the run's seed.
        let arrival_seed = self
            .arrival_seed
            .unwrap_or_else(|| config["rng_seed"].as_u64().unwrap_or(0));
        let mut arrivals = SplitMix64(arrival_seed ^ ARRIVAL_STREAM);
        let mut batch = Vec::new();
        loop {
            // A request the filter holds (asking the collector, say) is in flight
            // too. One answered at once (a local reply) frees its slot and readies its
            // session's next turn: the next batch takes them.
            loop {
                let free = self
                    .concurrency
                    .max(1)
                    .saturating_sub(in_flight.len() + held.len());
                batch.clear();
                batch.extend(std::iter::from_fn(|| order.take_next()).take(free));
                if batch.is_empty() {
                    break;
                }
                shuffle(&mut batch, &mut arrivals);
                for &i in &batch {
                    let vm = sent % workers;
                    sent += 1;
                    let sim = (&mut host, &mut fleet, &mut calls);
                    match self.dispatch(sim, vm, now, i, &items[i])? {
                        Routed::Engine(flight) => in_flight.push(flight),
                        Routed::Held(h) => held.push(h),
                        Routed::Done(record) => {
                            records[i] = Some(record);
                            order.complete(i);
                        }
                    }
                }
            }
            calls.schedule(&host, &mut fleet, now);
            let next_stream = in_flight
                .iter()
                .map(InFlight::next_ms)
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let next_call = calls.next();
            let event = match (next_stream, next_call) {
                (Some(s), Some(c)) if c.1 < s.1 => Event::Call(c.0, c.1),
                (Some(s), _) => Event::Stream(s.0, s.1),
                // Calls alone (a prober's) do not keep a finished replay going.
                (None, _) if records.iter().all(Option::is_some) => break,
                (None, Some(c)) => Event::Call(c.0, c.1),
                (None, None) => match next_timeout(&host, start_ms) {
                    // Held requests wait for calls nobody answers: they time out.
                    Some(t) if !held.is_empty() => Event::Timeout(t.max(now)),
                    _ => bail!("nothing in flight and nothing dispatchable: the replay is stuck"),
                },
            };
            let at = match event {
                Event::Stream(_, t) | Event::Call(_, t) | Event::Timeout(t) => t,
            };
            while let (Some(push_at), Some(token)) = (next_push, &token) {
                if push_at > at {
                    break;
                }
                push_stats(
                    &mut host,
                    &fleet,
                    (start_ms, push_at),
                    (&stats_path, token),
                    pushes % workers,
                )?;
                pushes += 1;
                next_push = interval.map(|i| push_at + i as f64);
            }
            now = now.max(at);
            move_clock(&mut host, start_ms, now)?;
            match event {
                Event::Stream(k, _) => match in_flight.get_mut(k) {
                    Some(flight) if matches!(flight.delivery, Delivery::FirstAt(_)) => {
                        first_token(&mut host, flight)?;
                    }
                    _ => {
                        let flight = in_flight.swap_remove(k);
                        let i = flight.item;
                        records[i] = Some(self.complete(&mut host, flight)?);
                        order.complete(i);
                    }
                },
                Event::Call(k, _) => calls.answer(&mut host, k)?,
                Event::Timeout(_) => {}
            }
            for h in std::mem::take(&mut held) {
                let out = host.vm(h.handle.vm).outcome(h.handle)?;
                let routed = (h.item, &items[h.item]);
                let sim = (&mut host, &mut fleet, &mut calls);
                match self.route(sim, routed, &out, h.sent, now)? {
                    Routed::Engine(flight) => in_flight.push(flight),
                    Routed::Held(h) => held.push(h),
                    Routed::Done(record) => {
                        records[h.item] = Some(record);
                        order.complete(h.item);
                    }
                }
            }
        }
        // Stats are read a moment after the last answer, as the demo reads Envoy's:
        // every VM has ticked since.
        move_clock(&mut host, start_ms, now + SETTLE_MS)?;
        let records: Vec<Record> = records.into_iter().flatten().collect();
        let summary = summarize(&records, Duration::from_secs_f64(now / 1000.0));
        Ok(ReplayRun {
            summary,
            records,
            host,
            fleet,
        })
    }

    /// Sends request `i` through the filter on `vm` at `now`.
    fn dispatch(
        &self,
        (host, fleet, calls): Sim<'_>,
        vm: usize,
        now: f64,
        i: usize,
        item: &WorkItem,
    ) -> Result<Routed> {
        let length = item.body.len().to_string();
        let mut spec = RequestSpec::post_json(&item.path, item.body.to_vec());
        spec.headers.push(("content-length", &length));
        // The replay reports each request's decision: it asks for the headers.
        spec.headers.push((EXPLAIN_HEADER, "1"));
        let out = host.vm(vm).request(spec)?;
        self.route((host, fleet, calls), (i, item), &out, now, now)
    }

    /// Where a request sent at `sent` stands at `now`: with an engine, still held by the
    /// filter (waiting for an HTTP call, say), or over (a local reply, or no engine).
    fn route(
        &self,
        (host, fleet, calls): Sim<'_>,
        (i, item): (usize, &WorkItem),
        out: &StreamOutcome,
        sent: f64,
        now: f64,
    ) -> Result<Routed> {
        let mut record = Record {
            line: item.line,
            start_ms: sent,
            ..Record::default()
        };
        if let Some(reply) = &out.local_response {
            record.status = u16::try_from(reply.status).ok();
            record.read_decision(|h| reply.header(h));
            record.error = Some(format!("HTTP {}: {}", reply.status, snippet(&reply.body)));
            record.latency_ms = now - sent;
            return Ok(Routed::Done(record));
        }
        if !out.continued && !out.finished {
            return Ok(Routed::Held(Held {
                item: i,
                handle: out.handle,
                sent,
            }));
        }
        let engine = fleet.find(
            out.header("x-llm-router-cluster"),
            out.header("x-gateway-destination-endpoint"),
        );
        let (true, Some(engine)) = (out.continued, engine) else {
            host.vm(out.handle.vm).reset(out.handle)?;
            record.error = Some("the filter sent the request to no known engine".into());
            return Ok(Routed::Done(record));
        };
        // A prefill copy sent alongside reaches its engine first: the decode engine
        // takes the KV it publishes.
        calls.schedule(host, fleet, now);
        let answer = fleet.serve(engine, now, &item.path, &out.request_body);
        let (done_ms, first_ms) = answer
            .served
            .map_or((now, now), |s| (s.finished_ms, s.first_token_ms));
        if item.stream && answer.status == 200 {
            // The engine's first byte is its first token.
            record.ttfb_ms = Some(first_ms - sent);
            record.ttft_ms = record.ttfb_ms;
        }
        let streamed = item.stream && answer.status == 200 && first_ms < done_ms;
        Ok(Routed::Engine(InFlight {
            item: i,
            handle: out.handle,
            dispatched_ms: sent,
            delivery: if streamed {
                Delivery::FirstAt(first_ms)
            } else {
                Delivery::Whole
            },
            done_ms,
            status: answer.status,
            body: answer.body,
            record,
        }))
    }

    /// The engine's answer reaches the filter, then the client; the stream ends.
    fn complete(&self, host: &mut Host, flight: InFlight) -> Result<Record> {
        let InFlight {
            handle,
            mut record,
            status,
            body,
            ..
        } = flight;
        record.latency_ms = flight.done_ms - flight.dispatched_ms;
        // The filter may have answered on its own meanwhile (a failed prefill copy:
        // a 502 after the body went upstream); the engine's answer then goes nowhere.
        let out = host.vm(handle.vm).outcome(handle)?;
        if let Some(reply) = out.local_response.filter(|_| out.finished) {
            record.status = u16::try_from(reply.status).ok();
            record.read_decision(|h| reply.header(h));
            record.error = Some(format!("HTTP {}: {}", reply.status, snippet(&reply.body)));
            return Ok(record);
        }
        let resp = match flight.delivery {
            // Headers and the first bytes went at the first token.
            Delivery::Rest => host.vm(handle.vm).respond_body(
                handle,
                body.get(FIRST_BYTES..).unwrap_or_default(),
                true,
            )?,
            Delivery::Whole | Delivery::FirstAt(_) => {
                host.vm(handle.vm)
                    .respond(handle, status, &RESPONSE_HEADERS, &body)?
            }
        };
        host.vm(handle.vm).finish(handle)?;
        record.status = u16::try_from(status).ok();
        record.read_decision(|h| resp.header(h));
        match parse_json_body(&resp.body) {
            Ok(facts) if (200..300).contains(&status) => {
                record.worker = facts.worker;
                if let Some(u) = facts.usage {
                    record.prompt_tokens = Some(u.prompt_tokens);
                    record.cached_tokens = Some(u.cached_tokens);
                }
            }
            Ok(facts) => {
                record.worker = facts.worker;
                record.error = Some(format!("HTTP {status}: {}", snippet(&resp.body)));
            }
            Err(e) => {
                record.worker = e.worker;
                record.error = Some(if (200..300).contains(&status) {
                    e.reason
                } else {
                    format!("HTTP {status}: {}", snippet(&resp.body))
                });
            }
        }
        Ok(record)
    }
}

/// A streamed answer's response headers and first bytes, at its first token.
fn first_token(host: &mut Host, flight: &mut InFlight) -> Result<()> {
    flight.delivery = Delivery::Rest;
    let first = flight.body.get(..FIRST_BYTES).unwrap_or(&flight.body);
    let mut vm = host.vm(flight.handle.vm);
    vm.respond_headers(flight.handle, flight.status, &RESPONSE_HEADERS)?;
    vm.respond_body(flight.handle, first, false)?;
    Ok(())
}

/// When the next pending HTTP call times out (ms since the replay started).
fn next_timeout(host: &Host, start_ms: u64) -> Option<f64> {
    host.pending_http_calls()
        .iter()
        .filter(|c| c.timeout_ms > 0)
        .map(|c| (c.dispatched_at_ms + u64::from(c.timeout_ms)).saturating_sub(start_ms) as f64)
        .min_by(f64::total_cmp)
}

/// The collector's push of the fleet's gauges at virtual `at` ms, on VM `vm`.
fn push_stats(
    host: &mut Host,
    fleet: &SimFleet,
    (start_ms, at): (u64, f64),
    (stats_path, token): (&str, &str),
    vm: usize,
) -> Result<()> {
    move_clock(host, start_ms, at)?;
    let mut spec = RequestSpec::post_json(stats_path, fleet.stats_push(at));
    let auth = format!("Bearer {token}");
    spec.headers.push(("authorization", &auth));
    let out = host.vm(vm).request(spec)?;
    host.vm(vm).finish(out.handle)?;
    Ok(())
}

/// Moves the host's clock to `start + at` ms (whole ms, never back).
fn move_clock(host: &mut Host, start_ms: u64, at: f64) -> Result<()> {
    let target = start_ms + at.ceil() as u64;
    let now = host.now_ms();
    if target > now {
        host.advance_time(target - now)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_arrives_in_an_order_drawn_from_the_seed() {
        let order = |seed: u64| {
            let mut items: Vec<usize> = (0..16).collect();
            shuffle(&mut items, &mut SplitMix64(seed));
            items
        };
        let once = order(7);
        assert_eq!(order(7), once, "the same seed, the same order");
        assert_ne!(
            once,
            (0..16).collect::<Vec<_>>(),
            "not the workload's order"
        );
        assert_ne!(order(8), once, "another seed, another order");
        let mut sorted = once.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>(), "every request, once");
        let mut one = vec![5];
        shuffle(&mut one, &mut SplitMix64(7));
        assert_eq!(one, [5], "a request alone goes as it is");
    }
}
