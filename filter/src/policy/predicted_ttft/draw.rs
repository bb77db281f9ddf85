//! Which candidates a sampled `predicted_ttft` request scores, drawn from what the
//! request's tree says (`super::sample` decides from these inputs): the
//! candidates whose conversation it continues, the holders of a match within the
//! margin of its longest, and the fleet's workers by conversations, fewest first.

use super::ladder::match_margin;
use super::sample::{ttft_sample, Drawn, Marks};
use crate::load::Candidate;
use crate::rng::Rng;
use crate::tree::{Leaves, TenantId, TenantMatches, Tree};

/// Positions in `candidates` of those a request scores, or `None` to score all: a
/// fleet no larger than `sample_size`, or `sample_size` 0. `position` is each
/// worker's among the candidates, by worker index; `held` the request's walk of
/// `tree` (the model's, if it has one yet), `leaves` the tree's conversations by
/// worker (`NO_LEAVES` without a tree), `input` the text's chars; `found` the
/// sample's room, kept from request to request.
pub fn sample(
    (tree, held, leaves): (Option<&Tree>, &TenantMatches, &Leaves),
    (candidates, position): (&[Candidate], &[Option<u32>]),
    (sample_size, input): (usize, u64),
    (found, rng): (&mut Vec<u64>, &mut dyn Rng),
) -> Option<Marks> {
    if sample_size == 0 || candidates.len() <= sample_size {
        return None;
    }
    let at = |t: TenantId| {
        position
            .get(t as usize)
            .copied()
            .flatten()
            .map(|p| p as usize)
    };
    let continuing: Vec<usize> = held.continued.iter().filter_map(|&t| at(t)).collect();
    let margin = usize::try_from(match_margin(input)).unwrap_or(0);
    let holders = tree
        .map(|t| t.holders_within(held, margin))
        .unwrap_or_default();
    let longest = held.longest();
    let fleet = candidates.last().map_or(0, |c| c.worker as usize + 1);
    let drawn = Drawn {
        holders: holders.iter(),
        holds: |t| {
            longest > margin && held.depth(t, leaves.get(t)).saturating_add(margin) >= longest
        },
        conversations: |t| leaves.get(t),
        fewest: leaves.fewest_first(fleet),
        position: at,
        continuing: &continuing,
    };
    ttft_sample(candidates.len(), sample_size, drawn, (found, rng))
}
