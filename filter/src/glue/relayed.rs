//! The stream as Envoy holds it (`route_in: one_vm` or not): shared with this VM's
//! relay (`super::relay`), which asks the routing VM after the stream's request
//! callbacks and applies the answer to it from a root context's callback.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::queues::go_on;
use super::relay::{ask, forget, wait};
use super::stream::Stream;

/// The stream as Envoy holds it: shared with this VM's relay, which applies the
/// routing VM's answer to it from a root context's callback.
pub struct Relayed(Rc<RefCell<Stream>>);

impl Relayed {
    pub fn new(stream: Stream) -> Relayed {
        Relayed(Rc::new(RefCell::new(stream)))
    }

    /// After a request callback that left a question (`Stream::question`): asks
    /// it and the stream waits, or, if it cannot be sent, decides here (the
    /// callback's answer to Envoy is then this one).
    fn after_request(&self, action: Action) -> Action {
        let Ok(mut s) = self.0.try_borrow_mut() else {
            return action;
        };
        if !s.waiting() {
            return action;
        }
        let (shared, ctx) = (s.state(), s.id());
        let mut slot = shared.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return action;
        };
        let (path, body, held) = s.question();
        if ask(&shared, state, ctx, path, body, held) {
            wait(state, ctx, Rc::downgrade(&self.0));
            return action;
        }
        s.route_late(state)
    }

    /// The stream ended (its log or its end, whichever comes first): the relay
    /// forgets it.
    fn ended(&self) {
        let Ok(s) = self.0.try_borrow() else {
            return;
        };
        let (shared, token) = (s.state(), s.prefill_token());
        let mut slot = shared.borrow_mut();
        if let Some(state) = slot.as_mut() {
            forget(state, s.id(), token);
        }
    }

    /// The stream's callback; `fallback` if the stream is busy (it never is: Envoy
    /// runs what a callback sets in motion after it returns).
    fn with<R>(&self, fallback: R, f: impl FnOnce(&mut Stream) -> R) -> R {
        match self.0.try_borrow_mut() {
            Ok(mut s) => f(&mut s),
            Err(_) => fallback,
        }
    }
}

impl Context for Relayed {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        let engines = self.with(None, |s| s.engines_answered(token, headers, body));
        let Some(action) = engines else {
            self.with((), |s| {
                s.on_http_call_response(token, headers, body, trailers)
            });
            return;
        };
        // `kv_match`'s answer came: the stream is routed (or asks the routing VM)
        // as its request callback would have, and goes on if it may.
        go_on(self.after_request(action));
    }

    fn on_done(&mut self) -> bool {
        self.ended();
        self.with(true, |s| s.on_done())
    }
}

impl HttpContext for Relayed {
    fn on_http_request_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        let action = self.with(Action::Continue, |s| {
            s.on_http_request_headers(headers, end_of_stream)
        });
        self.after_request(action)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let action = self.with(Action::Continue, |s| {
            s.on_http_request_body(body_size, end_of_stream)
        });
        self.after_request(action)
    }

    fn on_http_response_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |s| {
            s.on_http_response_headers(headers, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |s| {
            s.on_http_response_body(body_size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        self.ended();
        self.with((), |s| s.on_log())
    }
}
