//! Discovery mode's side of a collector push: the push's `membership` is merged
//! into the shared worker list (`crate::background::membership`), and the push's samples are
//! checked against the merged list before anything is stored, so a push is taken
//! or refused whole. A changed list is written with CAS (two pushes on two threads
//! never build on the same version) and shared through the operation ring.

use super::host::HostStore;
use super::state::State;
use crate::background::membership::{parse_membership, update};
use crate::config::WorkerConfig;
use crate::push::PushError;
use crate::shared::{Membership, Op, SetOutcome, CAS_ATTEMPTS};

/// Runs `check` (the samples' parse) against the worker list this push leaves, and
/// stores that list when it changed and `check` passed. Static mode, or a push
/// without `membership`: the current list, unchanged.
pub fn with_membership<T>(
    state: &mut State,
    body: &[u8],
    now_ms: u64,
    check: impl Fn(&[WorkerConfig]) -> Result<T, PushError>,
) -> Result<T, PushError> {
    if !state.router.config().discovers() {
        return check(&state.router.config().workers);
    }
    let Some(pushed) = parse_membership(body)? else {
        // This thread may not have applied the latest list yet.
        state.catch_up();
        return check(&state.router.config().workers);
    };
    for _ in 0..CAS_ATTEMPTS {
        let (current, cas) = state.shared.membership.read(&HostStore);
        let workers = update(state.router.config(), &current.workers, &pushed, now_ms)?;
        let out = check(&workers)?;
        if workers == current.workers {
            return Ok(out);
        }
        let next = Membership {
            version: current.version.saturating_add(1),
            workers,
        };
        match state.shared.membership.write(&HostStore, &next, cas) {
            SetOutcome::Stored => {
                state.metrics.membership_updates.inc();
                state.record_now(&Op::Membership(next));
                return Ok(out);
            }
            SetOutcome::CasMismatch => continue,
            SetOutcome::Failed => break,
        }
    }
    Err(PushError::BadRequest(
        "shared data refused the membership".into(),
    ))
}
