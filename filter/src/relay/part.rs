//! A root context's part in `route_in: one_vm`, as plain data: which VM it is to
//! the seat, its queues, the questions it waits on and what it tells the routing
//! VM, and the routing VM's holds of the requests it decided for others. The glue (`glue::relay`) acts on it.

use std::collections::HashMap;

use super::{Holds, Tell};

/// This root context's part.
#[derive(Debug, Default)]
pub enum Part {
    /// `route_in: every_vm`, or the stats listener's instance: decides here.
    #[default]
    EveryVm,
    /// Holds the seat: decides here, and for every VM that asks.
    Router {
        seat: Seated,
        /// When this root context last beat.
        beat_ms: u64,
        /// The counts of the requests decided for other VMs.
        holds: Holds,
    },
    /// Asks the routing VM.
    Asker {
        seat: Seated,
        /// The routing VM's queue (`None`: not found; requests are decided here).
        route: Option<u32>,
        /// This root context's queue for answers (`None`: none could be registered).
        reply: Option<u32>,
        /// The holder `route` belongs to.
        following: u64,
        /// Since when each stream waits for an answer, by context id.
        waiting: HashMap<u32, u64>,
        /// Questions routed here at the deadline whose answer is still to come, by
        /// context id.
        late: HashMap<u32, Late>,
        /// What this VM has to tell the routing VM of the requests it counts.
        tell: Tell,
    },
}

/// A question routed here at the deadline: the body and path its answer's records
/// are undone by, and since when.
#[derive(Debug)]
pub struct Late {
    pub body: Vec<u8>,
    pub path: Option<String>,
    pub since_ms: u64,
}

/// What a root context in `one_vm` knows of the seat.
#[derive(Debug)]
pub struct Seated {
    /// The configuration's digest: each configuration has its own seat.
    pub digest: String,
    /// This root context's nonce.
    pub me: u64,
    /// The VM id queues are resolved in.
    pub vm_id: String,
}

impl Part {
    /// Whether requests are asked about rather than decided here.
    pub fn asks(&self) -> bool {
        matches!(self, Part::Asker { .. })
    }

    /// Whether this root context decides other VMs' requests.
    pub fn routes_for_others(&self) -> bool {
        matches!(self, Part::Router { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn seated() -> Seated {
        Seated {
            digest: "d".into(),
            me: 1,
            vm_id: String::new(),
        }
    }

    #[test]
    fn only_a_router_routes_for_others_and_only_an_asker_asks() {
        let router = Part::Router {
            seat: seated(),
            beat_ms: 0,
            holds: Holds::default(),
        };
        let asker = Part::Asker {
            seat: seated(),
            route: None,
            reply: None,
            following: 0,
            waiting: HashMap::new(),
            late: HashMap::new(),
            tell: Tell::default(),
        };
        assert!(router.routes_for_others() && !router.asks());
        assert!(asker.asks() && !asker.routes_for_others());
        assert!(!Part::EveryVm.asks() && !Part::EveryVm.routes_for_others());
    }
}
