//! The bridge's counters, logged and served as Prometheus text on `--listen`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::envelope::Refusal;

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        /// Counters since start (`bus_connected` is a 0/1 gauge).
        #[derive(Debug, Default)]
        pub struct Stats {
            $(pub $name: AtomicU64,)*
            /// Messages refused at the fleet boundary, by `Refusal::index`.
            refused: [AtomicU64; Refusal::ALL.len()],
        }

        impl Stats {
            /// Prometheus text exposition, every name prefixed `llm_bridge_`.
            pub fn render(&self) -> String {
                let mut out = String::new();
                $(
                    let kind = if stringify!($name) == "bus_connected" { "gauge" } else { "counter" };
                    let _ = writeln!(out, "# HELP llm_bridge_{} {}", stringify!($name), $help);
                    let _ = writeln!(out, "# TYPE llm_bridge_{} {kind}", stringify!($name));
                    let _ = writeln!(out, "llm_bridge_{} {}", stringify!($name), self.$name.load(Ordering::Relaxed));
                )*
                let _ = writeln!(out, "# HELP llm_bridge_messages_refused Messages from the bus that changed nothing, by why (forged or altered: unauthenticated)");
                let _ = writeln!(out, "# TYPE llm_bridge_messages_refused counter");
                for r in Refusal::ALL {
                    let _ = writeln!(out, "llm_bridge_messages_refused{{reason=\"{}\"}} {}", r.as_str(), self.refused(r));
                }
                out
            }
        }
    };
}

counters! {
    bus_connected: "1 while the bus connection is up",
    bus_disconnects: "Times the bus connection was lost",
    connect_failures: "Attempts to connect to the bus that failed (retried)",
    batches_published: "Batches published to peers",
    ops_published: "Operations published to peers",
    polls_held: "Polls skipped because the bus was down (the operations wait in the ring)",
    publish_failures: "Batches that could not be published (sent again later)",
    export_failures: "Polls of the filter that failed",
    batches_imported: "Peer batches posted into the filter",
    import_failures: "Peer batches the filter did not take",
    catchup_requests: "Catch-up requests sent to peers",
    catchup_batches: "Batches received in catch-ups and replayed",
    catchup_answers: "Catch-up requests answered for peers",
}

impl Stats {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal; the first of each reason is logged, the rest only counted
    /// (whoever sends them must not fill the log).
    pub fn refuse(&self, r: Refusal, subject: &str) {
        if self.refused[r.index()].fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                reason = r.as_str(),
                subject,
                "refused a message from the bus (counted in llm_bridge_messages_refused; first of its kind logged)"
            );
        }
    }

    pub fn refused(&self, r: Refusal) -> u64 {
        self.refused[r.index()].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_rendered_with_its_type() {
        let s = Stats::default();
        Stats::inc(&s.ops_published);
        s.bus_connected.store(1, Ordering::Relaxed);
        let text = s.render();
        assert!(text.contains("llm_bridge_ops_published 1\n"));
        assert!(text.contains("# TYPE llm_bridge_bus_connected gauge"));
        assert!(text.contains("# TYPE llm_bridge_import_failures counter"));
        s.refuse(Refusal::Replayed, "llm-router.ops");
        let text = s.render();
        assert!(text.contains("llm_bridge_messages_refused{reason=\"replayed\"} 1\n"));
        assert!(text.contains("llm_bridge_messages_refused{reason=\"unauthenticated\"} 0\n"));
    }
}
