//! The sweep's JSON lines, one per seed and draw: the member's parameters, the
//! fleet it ran on and every policy's outcome. `--json-out` writes them;
//! `--others-from` reads an earlier run's back, so that a change to the default (a
//! rebuilt `.wasm`, other settings) is judged against the other policies without
//! replaying them, which is most of a sweep's time. An earlier line is used only
//! for the same member, draw and fleet: anything else would judge the default
//! against another workload.

use super::SeedRun;
use anyhow::{anyhow, bail, Context as _, Result};
use host_sim::sweep::{Decode, Fleet, Outcome};
use llm_load::family::Member;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One seed and draw as a JSON line, its outcomes the medians of `tie_breaks` runs.
pub(super) fn json_line(run: &SeedRun, (fleet, tie_breaks): (Fleet, u64)) -> String {
    let mut line = params(&run.member, run.draw, (fleet, tie_breaks));
    let outcomes: Vec<_> = run
        .outcomes
        .iter()
        .map(|o| {
            json!({"policy": o.policy, "cached": o.cached, "ttft_p50_ms": o.ttft_p50_ms,
                "ttft_p99_ms": o.ttft_p99_ms, "errors": o.errors, "per_engine": o.per_engine})
        })
        .collect();
    line.insert("outcomes".into(), outcomes.into());
    Value::Object(line).to_string()
}

/// Everything a line records but the outcomes: what an earlier outcome must have
/// been run on, and how many runs it is the median of, to stand beside a new one.
fn params(member: &Member, draw: u64, (fleet, tie_breaks): (Fleet, u64)) -> Map<String, Value> {
    let w = &member.workload;
    let engines: Vec<_> = member
        .engines
        .iter()
        .map(|e| {
            json!({"max_running": e.max_running, "prefill_us_per_token": e.prefill_us_per_token,
                "cache_chars": e.cache_chars})
        })
        .collect();
    let line = json!({
        "seed": member.seed, "draw": draw,
        "sessions": w.sessions, "turns": w.turns, "system_prompts": w.system_prompts,
        "system_prompt_chars": w.system_prompt_chars, "user_chars": w.user_chars,
        "concurrency": member.concurrency, "cache_share": member.cache_share(),
        "engines": engines, "vms": fleet.vms, "prefix_wait": fleet.prefix_wait,
    });
    let Value::Object(mut map) = line else {
        return Map::new();
    };
    // Engines that decode are recorded as such; lines of the family's instant
    // engines stay as they were written before engines could decode.
    if fleet.decode != Decode::INSTANT {
        map.insert(
            "decode_ms_per_token".into(),
            fleet.decode.ms_per_token.into(),
        );
        map.insert("output_tokens".into(), fleet.decode.output_tokens.into());
    }
    // Medians of several runs likewise; a line of one run has none.
    if tie_breaks > 1 {
        map.insert("tie_breaks".into(), tie_breaks.into());
    }
    map
}

/// Fields a line has only for some sweeps: absent from one side, they must be
/// absent from the other.
const OPTIONAL_FIELDS: [&str; 3] = ["decode_ms_per_token", "output_tokens", "tie_breaks"];

/// An earlier sweep's lines (`--others-from`), by seed and draw.
pub(super) struct Earlier {
    path: PathBuf,
    lines: BTreeMap<(u64, u64), Recorded>,
}

/// One line: what it was run on (`params`) and its outcomes.
struct Recorded {
    params: Map<String, Value>,
    outcomes: Vec<Outcome>,
}

impl Earlier {
    /// Reads `--json-out`'s file; a line that is not one names its number.
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut lines = BTreeMap::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let (at, recorded) =
                parse_line(line).with_context(|| format!("{} line {}", path.display(), i + 1))?;
            lines.insert(at, recorded);
        }
        Ok(Earlier {
            path: path.to_path_buf(),
            lines,
        })
    }

    /// The outcomes recorded for `member`'s `draw`, once the line is checked to
    /// be of the same member on the same fleet, the medians of as many runs.
    pub fn outcomes(&self, member: &Member, draw: u64, sweep: (Fleet, u64)) -> Result<&[Outcome]> {
        let recorded = self.lines.get(&(member.seed, draw)).ok_or_else(|| {
            anyhow!(
                "{} has no line for seed {} draw {draw}: sweep those seeds and draws with --json-out first",
                self.path.display(),
                member.seed
            )
        })?;
        // Floats compare exactly: serde_json reads them back as written
        // (`float_roundtrip`).
        let expected = params(member, draw, sweep);
        let fields = expected.keys().map(String::as_str).chain(OPTIONAL_FIELDS);
        for field in fields {
            let (there, here) = (recorded.params.get(field), expected.get(field));
            if there != here {
                let shown = |v: Option<&Value>| v.map_or("missing".to_string(), Value::to_string);
                bail!(
                    "{} seed {} draw {draw}: `{field}` is {} there but {} in this sweep \
                     (written by another family, engine model or fleet): sweep again with --json-out",
                    self.path.display(),
                    member.seed,
                    shown(there),
                    shown(here)
                );
            }
        }
        Ok(&recorded.outcomes)
    }
}

/// One line, and its seed and draw.
fn parse_line(line: &str) -> Result<((u64, u64), Recorded)> {
    let Value::Object(mut map) = serde_json::from_str::<Value>(line)? else {
        bail!("not a JSON object");
    };
    let outcomes = match map.remove("outcomes") {
        Some(Value::Array(list)) => list.iter().map(outcome).collect::<Result<Vec<_>>>()?,
        _ => bail!("no `outcomes` list"),
    };
    let number = |field: &str| {
        map.get(field)
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("no `{field}` number"))
    };
    let at = (number("seed")?, number("draw")?);
    Ok((
        at,
        Recorded {
            params: map,
            outcomes,
        },
    ))
}

fn outcome(v: &Value) -> Result<Outcome> {
    let number = |field: &str| {
        v.get(field)
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow!("an outcome without a `{field}` number"))
    };
    let per_engine = v
        .get("per_engine")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("an outcome without `per_engine`"))?
        .iter()
        .map(|n| {
            n.as_u64()
                .ok_or_else(|| anyhow!("`per_engine` holds a non-count"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Outcome {
        policy: v
            .get("policy")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("an outcome without a `policy`"))?
            .to_string(),
        cached: number("cached")?,
        ttft_p50_ms: number("ttft_p50_ms")?,
        ttft_p99_ms: number("ttft_p99_ms")?,
        errors: v
            .get("errors")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("an outcome without an `errors` count"))?
            as usize,
        per_engine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLEET: Fleet = Fleet {
        vms: 1,
        prefix_wait: true,
        decode: Decode::INSTANT,
    };
    /// One run of each policy on `FLEET`.
    const ONE: (Fleet, u64) = (FLEET, 1);

    fn run(seed: u64, draw: u64) -> SeedRun {
        let outcome = |policy: &str, cached: f64| Outcome {
            policy: policy.to_string(),
            cached,
            ttft_p50_ms: 10.5,
            ttft_p99_ms: 20.25,
            errors: 0,
            per_engine: vec![3, 4],
        };
        SeedRun {
            member: Member::draw(seed),
            draw,
            outcomes: vec![outcome("predicted_ttft", 0.5), outcome("cache_aware", 0.75)],
        }
    }

    /// `text` read back from a file of its own: tests run in parallel, and a
    /// name by the text's length could be two tests' at once.
    fn earlier(text: &str) -> Result<Earlier> {
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("host-sim-lines-{}-{n}.jsonl", std::process::id()));
        std::fs::write(&path, text)?;
        let read = Earlier::read(&path);
        let _ = std::fs::remove_file(&path);
        read
    }

    #[test]
    fn a_line_reads_back_as_the_outcomes_it_recorded() {
        let (a, b) = (run(3, 0), run(3, 1));
        let text = format!("{}\n{}\n", json_line(&a, ONE), json_line(&b, ONE));
        let read = earlier(&text).unwrap();
        assert_eq!(read.outcomes(&a.member, 0, ONE).unwrap(), &a.outcomes[..]);
        assert_eq!(read.outcomes(&b.member, 1, ONE).unwrap(), &b.outcomes[..]);
        let missing = read.outcomes(&Member::draw(4), 0, ONE).unwrap_err();
        assert!(
            missing.to_string().contains("no line for seed 4 draw 0"),
            "{missing}"
        );
    }

    /// Why `read` refuses the line of `member`'s draw 0 for a sweep of one run on
    /// `fleet`.
    fn refused(read: &Earlier, member: &Member, fleet: Fleet) -> String {
        read.outcomes(member, 0, (fleet, 1))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_line_of_another_member_or_fleet_is_refused_by_the_field_that_differs() {
        let a = run(5, 0);
        let read = earlier(&json_line(&a, ONE)).unwrap();
        let four = Fleet { vms: 4, ..FLEET };
        let e = refused(&read, &a.member, four);
        assert!(e.contains("`vms` is 1 there but 4"), "{e}");
        let credited = Fleet {
            prefix_wait: false,
            ..FLEET
        };
        let e = refused(&read, &a.member, credited);
        assert!(e.contains("`prefix_wait` is true there but false"), "{e}");
        // Engines that decode, against a line of instant ones and back.
        let decoding = Fleet {
            decode: Decode {
                ms_per_token: 20.0,
                output_tokens: 64,
            },
            ..FLEET
        };
        let e = refused(&read, &a.member, decoding);
        assert!(
            e.contains("`decode_ms_per_token` is missing there but 20.0"),
            "{e}"
        );
        let decoded = earlier(&json_line(&a, (decoding, 1))).unwrap();
        assert_eq!(
            decoded.outcomes(&a.member, 0, (decoding, 1)).unwrap(),
            &a.outcomes[..]
        );
        let e = refused(&decoded, &a.member, FLEET);
        assert!(
            e.contains("`decode_ms_per_token` is 20.0 there but missing"),
            "{e}"
        );
        let longer = Fleet {
            decode: Decode {
                output_tokens: 128,
                ..decoding.decode
            },
            ..FLEET
        };
        let e = refused(&decoded, &a.member, longer);
        assert!(e.contains("`output_tokens` is 64 there but 128"), "{e}");
        // Medians of three runs, against a line of one and back.
        let e = read
            .outcomes(&a.member, 0, (FLEET, 3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tie_breaks` is missing there but 3"), "{e}");
        let medians = earlier(&json_line(&a, (FLEET, 3))).unwrap();
        assert_eq!(
            medians.outcomes(&a.member, 0, (FLEET, 3)).unwrap(),
            &a.outcomes[..]
        );
        let e = refused(&medians, &a.member, FLEET);
        assert!(e.contains("`tie_breaks` is 3 there but missing"), "{e}");
        // The same seed from another family (here: more sessions).
        let mut other = a.member.clone();
        other.workload.sessions += 1;
        let e = refused(&read, &other, FLEET);
        assert!(e.contains("`sessions`"), "{e}");
        // A line written before the fleet was recorded.
        let old = json_line(&a, ONE).replace(r#","prefix_wait":true"#, "");
        let e = refused(&earlier(&old).unwrap(), &a.member, FLEET);
        assert!(e.contains("`prefix_wait` is missing there"), "{e}");
    }

    #[test]
    fn a_line_that_is_not_one_names_its_number() {
        let good = json_line(&run(1, 0), ONE);
        let e = earlier(&format!("{good}\n{{\"seed\":2}}\n"))
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(e.contains("line 2") && e.contains("outcomes"), "{e}");
        let e = earlier("not json\n")
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(e.contains("line 1"), "{e}");
    }
}
