//! `HOST_SIM_PERFMAP`: the guest's compiled functions named in a perf map, for
//! `perf` and `benches/guest-profile`. A test binary of its own: the variable is
//! the whole process's.

use host_sim::Filter;

#[test]
fn the_guests_compiled_code_is_named_in_a_perf_map() {
    let map = std::path::PathBuf::from(format!("/tmp/perf-{}.map", std::process::id()));
    let _ = std::fs::remove_file(&map);
    // Without the variable, no map.
    let path = host_sim::require_built_filter();
    Filter::load(&path).expect("load the filter");
    assert!(!map.exists(), "no map unless asked for");
    std::env::set_var("HOST_SIM_PERFMAP", "1");
    Filter::load(&path).expect("load the filter");
    let text = std::fs::read_to_string(&map).expect("the perf map was written");
    let _ = std::fs::remove_file(&map);
    // `<start> <size> <name>`, hex, one line a compiled function.
    let entries: Vec<(u64, u64, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let start = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(f.next()?, 16).ok()?;
            Some((start, size, f.next()?))
        })
        .collect();
    assert_eq!(entries.len(), text.lines().count(), "every line parses");
    // A stripped filter's functions go by index (an unstripped one's by name).
    let functions = entries
        .iter()
        .filter(|e| e.1 > 0 && e.2.starts_with("wasm[0]::function["))
        .count();
    assert!(
        functions > 100,
        "the filter's functions are mapped: {functions} of {} lines",
        entries.len()
    );
}
