//! `predicted_ttft`'s decision for one routing text: its walk of the model's tree
//! (each worker's share of the text and conversations), the candidates a sampled
//! fleet scores (`ttft_draw`), each one's predicted time to first token and the
//! ladder's pick.

use crate::decision::Decision;
use crate::load::Loads;
use crate::policy::{self, Candidate, Ladder, TtftParams};
use crate::rng::Rng;
use crate::tree::{Leaves, TenantMatches, Tree, Walked, NO_LEAVES};
use crate::ttft_draw;

/// What a decision fills and the next one refills, kept by the router so that
/// no request allocates them: at 256 workers each is a kilobyte.
#[derive(Debug, Default)]
pub struct Scratch {
    matches: TenantMatches,
    scored: Vec<policy::Scored>,
    /// The sample's tally of a short holder list (`policy::ttft_sample`).
    holders: Vec<u64>,
}

/// A decision, and what its record needs.
pub struct TtftRouted {
    pub decision: Option<Decision>,
    /// Chars of the text the chosen worker held.
    pub held_chars: usize,
    /// The text's chars.
    pub input_chars: usize,
    /// Where the walk ended, for the insert the decision records (none without a
    /// tree).
    pub walked: Option<Walked>,
}

/// Decides for `text` among `candidates` (the pool's, holding `inflight` requests
/// in all, at `position` by worker index) by `tree`, the model's if it has one
/// yet, filling `scratch`.
pub fn route(
    (tree, text): (Option<&Tree>, &str),
    (candidates, position, inflight): (&[Candidate], &[Option<u32>], u64),
    (loads, params): (&Loads, &TtftParams),
    scratch: &mut Scratch,
    rng: &mut dyn Rng,
) -> TtftRouted {
    let held = &mut scratch.matches;
    match tree {
        Some(t) => t.tenant_matches_into(text, held),
        None => held.clear(),
    }
    let held = &*held;
    let input_chars = match tree {
        Some(_) => held.text_chars,
        None => crate::tree::char_len(text),
    };
    let input = input_chars as u64;
    let leaves = tree.map_or(&NO_LEAVES, |t| t.leaves());
    // A fleet larger than the sample size scores a sample (`policy::ttft_sample`);
    // otherwise every candidate, in one loop.
    let sample = ttft_draw::sample(
        (tree, held, leaves),
        (candidates, position),
        (params.sample_size, input),
        (&mut scratch.holders, rng),
    );
    let list = std::mem::take(&mut scratch.scored);
    let mut ladder = Ladder::new(params, input, (inflight, candidates.len()), list);
    let seen = (loads, held, leaves);
    match &sample {
        None => {
            for c in candidates {
                ladder.push(scored_candidate(c, seen, (params, input)));
            }
        }
        Some(at) => at.for_each(|i| {
            if let Some(c) = candidates.get(i) {
                ladder.push(scored_candidate(c, seen, (params, input)));
            }
        }),
    }
    let decision = ladder.decide(rng);
    scratch.scored = ladder.into_list();
    let held_chars = decision
        .as_ref()
        .map_or(0, |d| held.depth(d.worker, leaves.get(d.worker)));
    TtftRouted {
        decision,
        held_chars,
        input_chars,
        walked: tree.map(|_| held.walked),
    }
}

/// Candidate `c` as the ladder compares it, from the loads, its share of the text
/// and its conversations (leaves by worker). Inlined into each loop that scores: as
/// a closure shared by two loops it was compiled to a call per worker, about 10k
/// Envoy instructions a request at 256 workers.
#[inline(always)]
fn scored_candidate(
    c: &Candidate,
    (loads, held, leaves): (&Loads, &TenantMatches, &Leaves),
    (params, input): (&TtftParams, u64),
) -> policy::Scored {
    let conversations = leaves.get(c.worker) as u64;
    loads
        .ttft_candidate(c, (held, conversations))
        .scored(params, input)
}
