//! How a stream is routed: decided here, or asked of the routing VM
//! (`route_in: one_vm`) and its answer applied; either way the routing header, PD's
//! prefill copy and the in-flight counts.

use proxy_wasm::types::{Action, LogLevel, MapType};

use super::{Routed, Stream};
use crate::decision::Decision;
use crate::glue::bookkeeping::{self, Undo};
use crate::glue::decide::decide;
use crate::glue::host;
use crate::glue::hostcalls;
use crate::glue::kv_match;
use crate::glue::prefill::{self, Leg};
use crate::glue::reply;
use crate::glue::state::State;
use crate::glue::telling;
use crate::kv_match::EngineHeld;
use crate::parse::{self, Parsed, Reading};
use crate::relay::{self, Verdict};
use crate::request::bookkeeping::booking_of;
use crate::request::plan::Refusal;
use crate::request::target::route_target;

impl Stream {
    /// Routes the request: in a VM that asks the routing VM (`route_in: one_vm`),
    /// keeps the body for the question the relay sends when the callback returns
    /// (`crate::glue::relayed::Relayed`), else decides here. On success the routing header
    /// is set and the stream may continue; on failure a local reply is sent and the
    /// stream must stay paused.
    pub(super) fn route(&mut self, body: &[u8], reading: Reading) -> Action {
        let shared = self.state.clone();
        let mut slot = shared.borrow_mut();
        let Some(state) = slot.as_mut() else {
            drop(slot);
            return reply::refusal(Refusal::NotConfigured);
        };
        let asks_engines = state
            .router
            .config()
            .kv_match
            .as_ref()
            .zip(reading.shape())
            .and_then(|(kv, shape)| kv_match::ask(state, kv, shape, body));
        if asks_engines.is_some() || state.relay.asks() {
            self.asked = Some(body.to_vec());
            self.kv_call = asks_engines;
            self.waiting = asks_engines.is_none();
            return Action::Pause;
        }
        self.route_here(state, body, reading)
    }
    /// `kv_match`: the collector's answer to the call `token` (`None`: another
    /// call's). The stream is routed now, with what the engines hold if it says.
    pub fn engines_answered(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
    ) -> Option<Action> {
        if self.kv_call != Some(token) {
            return None;
        }
        self.kv_call = None;
        let shared = self.state.clone();
        let mut slot = shared.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return Some(reply::refusal(Refusal::NotConfigured));
        };
        self.held = kv_match::answer(state, num_headers, body_size);
        if state.relay.asks() {
            // The body stays in `asked` for the question.
            self.waiting = true;
            return Some(Action::Pause);
        }
        let body = self.asked.take().unwrap_or_default();
        Some(self.route_here(state, &body, parse::read(&body)))
    }
    /// The question this stream is to ask: its path, body and what the engines
    /// hold of its prompt.
    pub fn question(&self) -> (Option<&str>, &[u8], Option<&EngineHeld>) {
        (
            self.path.as_deref(),
            self.asked.as_deref().unwrap_or_default(),
            self.held.as_ref(),
        )
    }
    /// Decides here (this VM routes, or its question found no answer in time)
    /// and applies the plan.
    pub(super) fn route_here(
        &mut self,
        state: &mut State,
        body: &[u8],
        reading: Reading,
    ) -> Action {
        let mut parsed = reading.parsed(self.path.as_deref());
        if let Parsed::Routable(r) = &mut parsed {
            r.held = self.held.take();
        }
        let decided = match decide(state, &mut parsed, body) {
            Ok(d) => d,
            Err(refusal) => return reply::refusal(refusal),
        };
        self.seen.judged = decided.judged;
        self.seen.routed_ms = state.shared.recent_ms.get();
        let plan = decided.plan;
        let prefill = plan
            .prefill
            .as_ref()
            .map(|l| (l.decision, l.body.as_slice()));
        if let Err(refusal) = self.apply(state, plan.main, prefill, body.len(), None) {
            return reply::refusal(refusal);
        }
        let undo = bookkeeping::book(state, plan, decided.text_chars);
        self.routed_on(undo)
    }
    /// The routing VM's answer (`route_in: one_vm`).
    pub fn answered(&mut self, state: &mut State, verdict: Verdict) -> Action {
        self.waiting = false;
        let routed = match verdict {
            Verdict::Refused(r) => return reply::refused(r.status, &r.reason, r.detail),
            Verdict::Routed(r) => r,
        };
        let body = self.asked.take().unwrap_or_default();
        self.seen.judged = routed.judged;
        self.seen.routed_ms = host::now_ms();
        state.shared.recent_ms.set(self.seen.routed_ms);
        // By name: the two VMs' worker lists may differ for a moment (discovery
        // mode: this VM keeps no tree, so it reads the list only on its tick).
        let known = |state: &State, name: &str| {
            state.router.config().workers.iter().any(|w| w.name == name)
        };
        let unknown = !known(state, &routed.main_worker)
            || routed
                .prefill
                .as_ref()
                .is_some_and(|(_, p, _)| !known(state, p));
        if unknown {
            state.refresh_membership();
        }
        let cfg = state.router.config();
        let index = |name: &str| cfg.workers.iter().position(|w| w.name == name);
        let main = index(&routed.main_worker).map(|i| Decision {
            worker: i as u32,
            ..routed.main
        });
        let prefill = match &routed.prefill {
            None => Some(None),
            Some((d, name, leg)) => index(name).map(|i| {
                let d = Decision {
                    worker: i as u32,
                    ..*d
                };
                Some((d, leg.as_slice()))
            }),
        };
        let applied = match (main, prefill) {
            (Some(main), Some(prefill)) => self
                .apply(state, main, prefill, body.len(), Some(self.id))
                .map(|()| main),
            _ => Err(Refusal::UnknownWorker),
        };
        let undo = Undo::remote(routed.records, body, self.path.clone());
        match applied {
            Ok(main) => {
                let prefill = self.routed.as_ref().and_then(|r| r.prefill.as_ref());
                let booked = booking_of(&main, prefill.map(|leg| &leg.decision));
                state.metrics.book(&booked, routed.text_chars as usize);
                self.routed_on(undo)
            }
            Err(refusal) => {
                // What the routing VM recorded and counted for it is undone.
                bookkeeping::unserved(state, undo, None);
                telling::never_sent(state, self.id);
                reply::refusal(refusal)
            }
        }
    }
    /// The routing VM did not answer (within `relay_deadline_ms`, or the question
    /// could not be sent): decided here, by what this VM knows (it keeps no tree:
    /// by load).
    pub fn route_late(&mut self, state: &mut State) -> Action {
        self.waiting = false;
        let body = self.asked.take().unwrap_or_default();
        let action = self.route_here(state, &body, parse::read(&body));
        // Kept for the late answer's records (`asked`).
        self.asked = Some(body);
        action
    }
    /// The question's body and path, once the stream no longer needs them.
    pub fn asked(&mut self) -> (Vec<u8>, Option<String>) {
        (self.asked.take().unwrap_or_default(), self.path.clone())
    }
    /// Whether the stream waits for the routing VM's answer.
    pub fn waiting(&self) -> bool {
        self.waiting
    }
    /// Sets the routing header and, in PD, sends the prefill leg (`prefill`: its
    /// decision and body), taking the in-flight counts (`told`: this stream's id,
    /// the routing VM counts it): the stream is routed.
    pub(super) fn apply(
        &mut self,
        state: &mut State,
        main: Decision,
        prefill: Option<(Decision, &[u8])>,
        body_len: usize,
        told: Option<u32>,
    ) -> Result<(), Refusal> {
        let target =
            route_target(state.router.config(), main.worker).ok_or(Refusal::UnknownWorker)?;
        let set = hostcalls::set_map_value(
            MapType::HttpRequestHeaders,
            target.header,
            Some(target.value),
        );
        if let Err(e) = set {
            host::log(
                LogLevel::Error,
                &format!("llm-router: cannot set {}: {e:?}", target.header),
            );
            return Err(Refusal::HeaderRejected);
        }
        let prefill = match prefill {
            None => None,
            Some((decision, leg_body)) => {
                let cfg = state.router.config();
                let sent = cfg
                    .workers
                    .get(decision.worker as usize)
                    .ok_or(Refusal::UnknownWorker)
                    .and_then(|w| {
                        // PD reads the path before the body (`on_http_request_headers`).
                        let path = self.path.as_deref().unwrap_or_default();
                        let token = prefill::send(cfg, w, path, body_len, leg_body)?;
                        Ok((w, token))
                    });
                match sent {
                    Ok((w, token)) => {
                        let told = told.map(|ctx| (ctx, relay::Leg::Prefill));
                        let (held, work) = bookkeeping::count(state, &w.name, &decision, told);
                        Some(Leg {
                            decision,
                            held,
                            token,
                            work,
                        })
                    }
                    Err(refusal) => {
                        state.metrics.pd_prefill_failures.inc();
                        return Err(refusal);
                    }
                }
            }
        };
        let told = told.map(|ctx| (ctx, relay::Leg::Main));
        let (held, work) = bookkeeping::count(state, target.worker, &main, told);
        self.routed = Some(Routed {
            decision: main,
            held,
            work,
            prefill,
            undo: Undo::default(),
        });
        Ok(())
    }
    /// The stream is routed, `undo` undoing its records: Envoy looks for the route
    /// again, now that the header exists.
    pub(super) fn routed_on(&mut self, undo: Undo) -> Action {
        if let Some(routed) = self.routed.as_mut() {
            routed.undo = undo;
        }
        if let Err(e) = hostcalls::call_foreign_function("clear_route_cache", None) {
            host::log(
                LogLevel::Warn,
                &format!("llm-router: clear_route_cache failed: {e:?}"),
            );
        }
        Action::Continue
    }
}
