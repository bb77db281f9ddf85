//! The prefix tree on fleet-shaped contents: every tenant (worker) holds conversations
//! that share a common system prompt, then a per-tenant part, then diverge per
//! conversation. Measures the lookup of a text that hits (a conversation's next turn)
//! and the insert of a new turn extending a held text, for texts of 4 KiB, 128 KiB and
//! 1 MiB and 1/4/16/64 tenants.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use llm_router::rng::{Rng, SplitMix64};
use llm_router::tree::{TenantId, Tree};
use std::hint::black_box;
use std::time::Duration;

const SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (128 << 10, "128KiB"), (1 << 20, "1MiB")];
const TENANTS: [u32; 4] = [1, 4, 16, 64];
/// Conversations per tenant.
const CONVS: usize = 2;

/// Text from the filter's own seeded generator.
struct Words(SplitMix64);

impl Words {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// `len` bytes of pseudo-random English-like words (deterministic per seed).
    fn text(&mut self, len: usize) -> String {
        const VOCAB: [&str; 16] = [
            "the", "model", "answers", "a", "question", "about", "routing", "cache", "prefix",
            "worker", "tokens", "with", "care", "and", "some", "detail",
        ];
        let mut s = String::with_capacity(len + 16);
        while s.len() < len {
            s.push_str(VOCAB[(self.next() % 16) as usize]);
            s.push(if self.next() % 96 < 8 { '\n' } else { ' ' });
        }
        s.truncate(len);
        s
    }
}

/// A fleet's tree: texts of `size` bytes, half a shared prefix, a quarter per tenant,
/// a quarter per conversation. Returns the tree and every held text.
fn fleet(size: usize, tenants: u32) -> (Tree, Vec<(TenantId, String)>) {
    let mut words = Words(SplitMix64(42));
    let common = words.text(size / 2);
    let mut tree = Tree::new();
    let mut texts = Vec::new();
    let mut clock = 0;
    for t in 0..tenants {
        let tenant_part = format!("tenant {t}: {}", words.text(size / 4));
        for c in 0..CONVS {
            let conv = format!("conv {c}: {}", words.text(size / 4));
            let text = format!("{common}{tenant_part}{conv}");
            clock += 1;
            tree.insert(&text, t, clock);
            texts.push((t, text));
        }
    }
    (tree, texts)
}

fn bench_tree(c: &mut Criterion) {
    let mut group = c.benchmark_group("tree");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (size, size_name) in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        for tenants in TENANTS {
            let (mut tree, texts) = fleet(size, tenants);
            // The next turn of a conversation held by a tenant in the middle.
            let (owner, held) = texts[texts.len() / 2].clone();
            let next_turn = format!("{held}\nuser: and one more question\n");
            group.bench_with_input(
                BenchmarkId::new(format!("match_hit/{size_name}"), tenants),
                &next_turn,
                |b, text| {
                    b.iter(|| {
                        let m = tree.prefix_match(black_box(text));
                        assert!(m.owners.contains(&owner));
                        m
                    })
                },
            );
            // Each iteration inserts a new turn (a new leaf under the held text); the
            // text is built outside the measurement.
            let mut turn = 0u64;
            let mut clock = 1_000_000u64;
            group.bench_function(
                BenchmarkId::new(format!("insert_turn/{size_name}"), tenants),
                |b| {
                    b.iter_batched(
                        || {
                            turn += 1;
                            format!("{held}\nuser: question number {turn}\n")
                        },
                        |text| {
                            clock += 1;
                            tree.insert(black_box(&text), owner, clock);
                            text
                        },
                        BatchSize::LargeInput,
                    )
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_tree);
criterion_main!(benches);
