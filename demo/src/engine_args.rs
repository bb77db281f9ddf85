//! Each engine mock's own arguments beside the fleet's common ones: one engine can be
//! slower or smaller than the others (`--engine-arg-for`, a family member's fleet).
//! An engine's own flag replaces the common flag of the same name, because the engine
//! mock refuses a flag given twice.

/// `NAME=ARG` of `--engine-arg-for`: the engine's name and one argument for it.
pub fn parse_for(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, arg)) if !name.is_empty() && !name.starts_with('-') && !arg.is_empty() => {
            Ok((name.to_string(), arg.to_string()))
        }
        _ => Err(format!(
            "expected ENGINE=ARG, e.g. w2=--prefill-us-per-token=400, got {s:?}"
        )),
    }
}

/// `base` then `over`, less the flags of `base` that `over` sets again (with their
/// value, `--name=value` or `--name value`).
pub fn merged(base: &[String], over: &[String]) -> Vec<String> {
    let replaced: Vec<&str> = over.iter().filter_map(|a| flag_name(a)).collect();
    let mut out = Vec::new();
    let mut args = base.iter().peekable();
    while let Some(arg) = args.next() {
        if flag_name(arg).is_some_and(|name| replaced.contains(&name)) {
            if !arg.contains('=') {
                args.next_if(|value| !value.starts_with('-'));
            }
            continue;
        }
        out.push(arg.clone());
    }
    out.extend(over.iter().cloned());
    out
}

/// The `--name` of `--name` or `--name=value`; `None` for a value.
fn flag_name(arg: &str) -> Option<&str> {
    arg.starts_with("--")
        .then(|| arg.split_once('=').map_or(arg, |(name, _)| name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_engine_argument_names_its_engine() {
        assert_eq!(
            parse_for("w2=--prefill-us-per-token=400").unwrap(),
            ("w2".to_string(), "--prefill-us-per-token=400".to_string())
        );
        for bad in ["--max-running=2", "w2", "w2=", "=--max-running=2"] {
            assert!(
                parse_for(bad).is_err(),
                "{bad} names no engine and argument"
            );
        }
    }

    #[test]
    fn an_engines_own_flag_replaces_the_common_one() {
        let base = strings(&[
            "--prefill-us-per-token=100",
            "--max-running",
            "2",
            "--metrics-style=sglang",
        ]);
        let over = strings(&["--max-running=4", "--prefill-us-per-token=400"]);
        assert_eq!(
            merged(&base, &over),
            strings(&[
                "--metrics-style=sglang",
                "--max-running=4",
                "--prefill-us-per-token=400"
            ])
        );
        assert_eq!(
            merged(&base, &[]),
            base,
            "nothing of its own: the common flags"
        );
    }
}
