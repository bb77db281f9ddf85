//! The run as a picture: one self-contained HTML page (inline SVG, no scripts, no
//! network) with what people look at first when judging a router: where requests went
//! over time, how much of the prompt the engines served from cache over time, the
//! latency distributions (end to end and time to first token), and the router's
//! decisions over time.
//!
//! Time runs along `Record::start_ms`, cut into [`BINS`] equal slices of the run;
//! distributions are empirical CDFs, so no bucket choice hides a tail.

use crate::record::Record;
use crate::stats::Summary;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Time slices of a run on the time-series charts.
pub const BINS: usize = 30;
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 260.0;
/// Plot area margins: left (axis labels), right (legend), top, bottom.
const MARGIN: (f64, f64, f64, f64) = (56.0, 150.0, 16.0, 36.0);
/// Series colours, in order (colour-blind-safe Okabe-Ito palette).
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
];

/// The page for one run titled `title`.
pub fn page(title: &str, summary: &Summary, records: &[Record]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:sans-serif;margin:24px;max-width:900px}}\
         table{{border-collapse:collapse}}td,th{{padding:2px 10px;text-align:right}}\
         th{{text-align:left}}svg{{display:block;margin:8px 0 24px}}</style></head><body>\n",
        escape(title)
    );
    let _ = writeln!(out, "<h1>{}</h1>", escape(title));
    out += &summary_table(summary);
    let series = Series::of(records);
    out += "<h2>Requests per worker over time</h2>\n";
    out += &lines(&series.per_worker, "requests per slice", series.span_s);
    out += "<h2>Cached share of prompt tokens over time</h2>\n";
    out += &lines(
        &series.cached_ratio,
        "cached / prompt tokens",
        series.span_s,
    );
    out += "<h2>Latency distribution</h2>\n";
    out += &cdf(&series.latencies);
    out += "<h2>Router decisions over time</h2>\n";
    out += &lines(&series.decisions, "requests per slice", series.span_s);
    out += "</body></html>\n";
    out
}

fn summary_table(s: &Summary) -> String {
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1} ms"));
    let rows = [
        ("requests", s.requests.to_string()),
        ("errors", s.errors.to_string()),
        (
            "cached tokens",
            format!(
                "{} of {} ({:.1}%)",
                s.cached_tokens,
                s.prompt_tokens,
                100.0 * s.cached_token_ratio
            ),
        ),
        (
            "latency p50 / p99",
            format!("{} / {}", ms(s.p50_ms), ms(s.p99_ms)),
        ),
        (
            "TTFT p50 / p99",
            format!("{} / {}", ms(s.ttft_p50_ms), ms(s.ttft_p99_ms)),
        ),
        (
            "wall time",
            format!("{:.2} s ({:.1} req/s)", s.wall_s, s.req_per_s),
        ),
    ];
    let mut out = String::from("<table>\n");
    for (k, v) in rows {
        let _ = writeln!(out, "<tr><th>{k}</th><td>{}</td></tr>", escape(&v));
    }
    out + "</table>\n"
}

/// What the charts plot, computed once from the records.
struct Series {
    span_s: f64,
    per_worker: BTreeMap<String, Vec<f64>>,
    cached_ratio: BTreeMap<String, Vec<f64>>,
    decisions: BTreeMap<String, Vec<f64>>,
    /// Sorted samples in ms: `end to end` and, for streams, `TTFT`.
    latencies: BTreeMap<String, Vec<f64>>,
}

impl Series {
    fn of(records: &[Record]) -> Series {
        let span_ms = records
            .iter()
            .map(|r| r.start_ms)
            .fold(0.0_f64, f64::max)
            .max(1.0);
        let bin = |r: &Record| ((r.start_ms / span_ms * BINS as f64) as usize).min(BINS - 1);
        let mut per_worker: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut decisions: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut tokens = vec![(0u64, 0u64); BINS];
        let mut e2e = Vec::new();
        let mut ttft = Vec::new();
        for r in records {
            let b = bin(r);
            let worker = r.worker.clone().unwrap_or_else(|| "(none)".into());
            bump(&mut per_worker, worker, b);
            if let Some(d) = &r.decision {
                bump(&mut decisions, d.clone(), b);
            }
            if r.is_ok() {
                if let Some(t) = tokens.get_mut(b) {
                    t.0 += r.cached_tokens.unwrap_or(0);
                    t.1 += r.prompt_tokens.unwrap_or(0);
                }
                e2e.push(r.latency_ms);
                ttft.extend(r.ttft_ms);
            }
        }
        let ratio = tokens
            .iter()
            .map(|(c, p)| if *p > 0 { *c as f64 / *p as f64 } else { 0.0 })
            .collect();
        let mut latencies = BTreeMap::new();
        for (name, mut v) in [("end to end", e2e), ("TTFT (streams)", ttft)] {
            if !v.is_empty() {
                v.sort_by(f64::total_cmp);
                latencies.insert(name.to_string(), v);
            }
        }
        Series {
            span_s: span_ms / 1000.0,
            per_worker,
            cached_ratio: BTreeMap::from([("cached ratio".to_string(), ratio)]),
            decisions,
            latencies,
        }
    }
}

fn bump(map: &mut BTreeMap<String, Vec<f64>>, key: String, bin: usize) {
    let v = map.entry(key).or_insert_with(|| vec![0.0; BINS]);
    if let Some(x) = v.get_mut(bin) {
        *x += 1.0;
    }
}

/// One line per series over the run's time slices.
fn lines(series: &BTreeMap<String, Vec<f64>>, y_label: &str, span_s: f64) -> String {
    let y_max = series
        .values()
        .flatten()
        .copied()
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let plot = Plot::new(span_s, y_max);
    let mut out = plot.frame(&format!("time into the run (s), {BINS} slices"), y_label);
    for (i, (name, values)) in series.iter().enumerate() {
        let step = span_s / BINS as f64;
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(b, v)| ((b as f64 + 0.5) * step, *v))
            .collect();
        out += &plot.polyline(&points, i);
        out += &plot.legend(name, i);
    }
    out + "</svg>\n"
}

/// Empirical CDFs of latency samples (x: ms, y: share of requests at or below).
fn cdf(series: &BTreeMap<String, Vec<f64>>) -> String {
    let x_max = series
        .values()
        .filter_map(|v| v.last())
        .copied()
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let plot = Plot::new(x_max, 1.0);
    let mut out = plot.frame("latency (ms)", "share of requests");
    for (i, (name, sorted)) in series.iter().enumerate() {
        let n = sorted.len() as f64;
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .map(|(k, x)| (*x, (k + 1) as f64 / n))
            .collect();
        out += &plot.polyline(&points, i);
        out += &plot.legend(name, i);
    }
    out + "</svg>\n"
}

/// Data-to-pixel mapping of one chart.
struct Plot {
    x_max: f64,
    y_max: f64,
}

impl Plot {
    fn new(x_max: f64, y_max: f64) -> Plot {
        Plot {
            x_max: if x_max > 0.0 { x_max } else { 1.0 },
            y_max: if y_max > 0.0 { y_max } else { 1.0 },
        }
    }

    fn x(&self, v: f64) -> f64 {
        let (l, r, _, _) = MARGIN;
        l + v / self.x_max * (WIDTH - l - r)
    }

    fn y(&self, v: f64) -> f64 {
        let (_, _, t, b) = MARGIN;
        HEIGHT - b - v / self.y_max * (HEIGHT - t - b)
    }

    /// The opening tag, axes and tick labels (min and max of each axis).
    fn frame(&self, x_label: &str, y_label: &str) -> String {
        let (l, r, t, b) = MARGIN;
        let (x0, x1, y0, y1) = (l, WIDTH - r, HEIGHT - b, t);
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             font-size=\"11\">\n\
             <path d=\"M{x0} {y1} V{y0} H{x1}\" fill=\"none\" stroke=\"#444\"/>\n\
             <text x=\"{tx}\" y=\"{ty}\" text-anchor=\"middle\">{xl}</text>\n\
             <text x=\"{x0}\" y=\"{ty0}\" text-anchor=\"middle\">0</text>\n\
             <text x=\"{x1}\" y=\"{ty0}\" text-anchor=\"middle\">{xm}</text>\n\
             <text x=\"{ly}\" y=\"{y0}\" text-anchor=\"end\">0</text>\n\
             <text x=\"{ly}\" y=\"{yt}\" text-anchor=\"end\">{ym}</text>\n\
             <text x=\"12\" y=\"{mid}\" transform=\"rotate(-90 12 {mid})\" \
             text-anchor=\"middle\">{yl}</text>\n",
            tx = (x0 + x1) / 2.0,
            ty = HEIGHT - 4.0,
            ty0 = y0 + 14.0,
            xl = escape(x_label),
            xm = short(self.x_max),
            ly = x0 - 6.0,
            yt = y1 + 10.0,
            ym = short(self.y_max),
            mid = (y0 + y1) / 2.0,
            yl = escape(y_label),
        )
    }

    fn polyline(&self, points: &[(f64, f64)], i: usize) -> String {
        let pts: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", self.x(*x), self.y(*y)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"/>\n",
            colour(i),
            pts.join(" ")
        )
    }

    fn legend(&self, name: &str, i: usize) -> String {
        let (_, r, t, _) = MARGIN;
        let x = WIDTH - r + 12.0;
        let y = t + 14.0 * i as f64 + 8.0;
        format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>\n",
            y - 8.0,
            colour(i),
            x + 14.0,
            y + 1.0,
            escape(name)
        )
    }
}

fn colour(i: usize) -> &'static str {
    PALETTE.get(i % PALETTE.len()).copied().unwrap_or("#000000")
}

/// An axis maximum, short: `0.85`, `12.5`, `1234`.
fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::summarize;
    use std::time::Duration;

    fn record(i: usize, worker: &str, decision: &str, cached: u64) -> Record {
        Record {
            line: i + 1,
            start_ms: i as f64 * 10.0,
            status: Some(200),
            latency_ms: 5.0 + i as f64,
            ttft_ms: i.is_multiple_of(2).then_some(2.0),
            worker: Some(worker.into()),
            decision: Some(decision.into()),
            prompt_tokens: Some(100),
            cached_tokens: Some(cached),
            ..Record::default()
        }
    }

    #[test]
    fn the_page_has_every_chart_and_series_and_balanced_svg() {
        let records: Vec<Record> = (0..60usize)
            .map(|i| {
                let w = if i.is_multiple_of(3) { "w0" } else { "w<1>" };
                let d = if i < 10 { "cache_miss" } else { "cache_hit" };
                record(i, w, d, if i < 10 { 0 } else { 80 })
            })
            .collect();
        let s = summarize(&records, Duration::from_secs(1));
        let html = page("run & report", &s, &records);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<svg").count(), 4, "four charts");
        assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
        for name in [
            "w0",
            "w&lt;1&gt;",
            "cache_hit",
            "cache_miss",
            "end to end",
            "TTFT (streams)",
        ] {
            assert!(html.contains(&format!(">{name}</text>")), "legend {name}");
        }
        assert!(html.contains("run &amp; report"), "the title is escaped");
        assert!(!html.contains("w<1>"), "worker names are escaped");
        assert!(
            !html.contains("NaN") && !html.contains("inf"),
            "finite coordinates"
        );
    }

    #[test]
    fn the_cached_ratio_follows_the_run() {
        // The first third misses, the rest hits 80%: the series starts at 0, ends at 0.8.
        let records: Vec<Record> = (0..90)
            .map(|i| record(i, "w0", "x", if i < 30 { 0 } else { 80 }))
            .collect();
        let s = Series::of(&records);
        let ratio = &s.cached_ratio["cached ratio"];
        assert_eq!(ratio.len(), BINS);
        assert_eq!(ratio.first(), Some(&0.0));
        assert!((ratio.last().copied().unwrap_or(0.0) - 0.8).abs() < 1e-9);
        let total: f64 = s.per_worker["w0"].iter().sum();
        assert_eq!(total, 90.0, "every request in some slice");
    }

    #[test]
    fn an_empty_run_still_renders() {
        let html = page("empty", &Summary::default(), &[]);
        assert_eq!(html.matches("<svg").count(), 4);
        assert!(!html.contains("NaN"));
    }
}
