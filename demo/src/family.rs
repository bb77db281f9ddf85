//! A member of `llm-load`'s workload family (`host-sim sweep`) as the demo's fleet:
//! each engine's engine mock flags, so the member runs through Envoy on the fleet
//! `host-sim sweep` simulated in virtual time.

use llm_load::family::{EngineShape, Member};
use llm_load::fleet::worker_name;
use std::collections::BTreeMap;

/// Characters per cache block the demo's engine mocks use, the engine model's
/// default (which `host-sim sweep` sizes its caches in).
pub const BLOCK_CHARS: usize = 64;

/// The engine mock flags of one engine of a member's fleet.
pub fn engine_args(shape: &EngineShape) -> Vec<String> {
    vec![
        format!("--max-running={}", shape.max_running),
        format!("--prefill-us-per-token={}", shape.prefill_us_per_token),
        format!("--cache-blocks={}", shape.cache_chars.div_ceil(BLOCK_CHARS)),
        format!("--block-chars={BLOCK_CHARS}"),
    ]
}

/// Every engine's flags by its name (`w0..`), engine `i` of the member being `w{i}`.
pub fn fleet_args(member: &Member) -> BTreeMap<String, Vec<String>> {
    member
        .engines
        .iter()
        .enumerate()
        .map(|(i, shape)| (worker_name(i), engine_args(shape)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_of_a_member_gets_its_own_shape() {
        let member = Member {
            engines: vec![
                EngineShape {
                    max_running: 3,
                    prefill_us_per_token: 50.0,
                    cache_chars: 6400,
                },
                EngineShape {
                    max_running: 3,
                    prefill_us_per_token: 212.5,
                    cache_chars: 6401,
                },
            ],
            ..Member::draw(7)
        };
        let fleet = fleet_args(&member);
        assert_eq!(fleet.keys().collect::<Vec<_>>(), ["w0", "w1"]);
        assert_eq!(
            fleet["w0"],
            [
                "--max-running=3",
                "--prefill-us-per-token=50",
                "--cache-blocks=100",
                "--block-chars=64"
            ]
        );
        assert_eq!(
            fleet["w1"][1..3],
            ["--prefill-us-per-token=212.5", "--cache-blocks=101"],
            "a slower engine, and a cache rounded up to whole blocks"
        );
    }

    #[test]
    fn a_drawn_member_gives_one_engine_per_shape() {
        let member = Member::draw(7);
        assert_eq!(fleet_args(&member).len(), member.engines.len());
    }
}
