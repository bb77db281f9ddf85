//! What a routed stream gives back and tells as its response comes and it ends:
//! its in-flight counts, the verdict on its upstream, its first byte, its decision
//! headers.

use proxy_wasm::types::MapType;

use super::Stream;
use crate::glue::bookkeeping;
use crate::glue::health;
use crate::glue::hostcalls;
use crate::support::header_names::{
    DECISION_HEADER, DECODE_REASON_HEADER, PREDICTED_TTFT_HEADER, PREFILL_WORKER_HEADER,
    REASON_HEADER, WORKER_HEADER,
};

impl Stream {
    /// Gives the in-flight counts back, exactly once per routed stream, however the
    /// stream ended (completed, reset, client gone).
    pub(super) fn release(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if let Some(state) = self.state.borrow().as_ref() {
            routed.held.release(state);
            bookkeeping::end_work(state, &mut routed.work);
            if let Some(leg) = routed.prefill.as_mut() {
                leg.held.release(state);
                bookkeeping::end_work(state, &mut leg.work);
            }
        }
    }
    /// Takes the main worker out if its upstream failed (`super::health`); not after
    /// the filter's own reply (a failed prefill), which is no verdict on it, nor after
    /// a 4xx (`crate::worker::health::refused`), a verdict on the request. Each way no engine
    /// served the request: what it recorded is undone.
    pub(super) fn judge_upstream(&mut self) {
        if std::mem::replace(&mut self.judged, true) {
            return;
        }
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        let mut slot = self.state.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return;
        };
        let worker = routed.held.worker();
        if self.replied {
            bookkeeping::unserved(state, std::mem::take(&mut routed.undo), None);
        } else if health::observe(state, worker, self.seen)
            || crate::worker::health::refused(self.seen.status)
        {
            bookkeeping::unserved(state, std::mem::take(&mut routed.undo), Some(worker));
        }
    }
    /// The first response byte: the booked prefill is done (at most once).
    pub(super) fn first_byte(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if let Some(state) = self.state.borrow().as_ref() {
            routed.held.first_byte(state);
            bookkeeping::first_byte(state, &mut routed.work);
        }
    }
    /// The decision headers of a routed response (`decision_headers`).
    pub(super) fn decision_headers(&self) {
        let Some(routed) = self.routed.as_ref() else {
            return;
        };
        if !self.explain {
            return;
        }
        let main = routed.decision;
        // In PD mode the cache decision is the prefill pool's.
        let cache = routed.prefill.as_ref().map_or(main, |leg| leg.decision);
        let predicted = cache
            .predicted
            .map(|p| format!("{:.1}", p.ttft_us as f64 / 1000.0));
        let mut headers = vec![
            (WORKER_HEADER, routed.held.worker()),
            (DECISION_HEADER, cache.label().as_str()),
            (REASON_HEADER, cache.reason.as_str()),
        ];
        if let Some(ms) = predicted.as_deref() {
            headers.push((PREDICTED_TTFT_HEADER, ms));
        }
        if let Some(leg) = &routed.prefill {
            headers.push((PREFILL_WORKER_HEADER, leg.held.worker()));
            headers.push((DECODE_REASON_HEADER, main.reason.as_str()));
        }
        for (h, v) in headers {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, h, Some(v));
        }
    }
}
