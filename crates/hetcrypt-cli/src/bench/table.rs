//! The bench's Markdown: the seeds' Table 2 (time per policy and size) and Table 3
//! (jobs per engine), speed-ups, efficiency against the ideal combination.

use super::stats::{BenchReport, PolicyResult, SizeResult};
use crate::output::Grid;
use crate::workload::{human_size, plural};

/// Milliseconds with about three significant digits.
pub fn fmt_ms(seconds: f64) -> String {
    let ms = seconds * 1e3;
    if ms < 10.0 {
        format!("{ms:.3}")
    } else if ms < 100.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".to_string(), |x| format!("{x:.2}x"))
}

fn fmt_percent(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".to_string(), |x| format!("{:.0}%", x * 100.0))
}

/// One table with a row per size and a column per policy.
fn per_policy(report: &BenchReport, cell: impl Fn(&SizeResult, &PolicyResult) -> String) -> Grid {
    let mut header = vec!["size".to_string()];
    header.extend(report.policies.iter().cloned());
    let mut grid = Grid::new(header).right_align_from(1);
    for s in &report.sizes {
        let mut row = vec![human_size(s.size)];
        for p in &report.policies {
            row.push(s.policy(p).map_or_else(|| "-".to_string(), |r| cell(s, r)));
        }
        grid.row(row);
    }
    grid
}

/// Table A: median time (min-max) per policy and size.
pub fn time_table(report: &BenchReport) -> Grid {
    per_policy(report, |_, r| {
        format!(
            "{} ({}-{})",
            fmt_ms(r.median_s),
            fmt_ms(r.min_s),
            fmt_ms(r.max_s)
        )
    })
}

/// Table B: jobs per engine in the median run.
pub fn jobs_table(report: &BenchReport) -> Grid {
    per_policy(report, |_, r| {
        r.jobs_per_engine
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(e, n)| format!("{e} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Table C: speed-up of each policy against only:cpu and against the best single
/// engine, and its efficiency against the ideal combination.
pub fn comparison_table(report: &BenchReport) -> Grid {
    per_policy(report, |_, r| {
        format!(
            "{} / {} / {}",
            fmt_ratio(r.speedup_vs_cpu),
            fmt_ratio(r.speedup_vs_best_single),
            fmt_percent(r.efficiency)
        )
    })
}

/// A paired ratio below this whose whole confidence interval lies below it is a loss
/// to the best single engine beyond measurement noise (the contract `adaptive` is held
/// to: never more than 3% slower).
pub const LOSS_BELOW: f64 = 0.97;

/// Table D: the best single engine's time over each policy's, paired round by round:
/// median [interval], flagged where the whole interval is a loss.
pub fn paired_table(report: &BenchReport) -> Grid {
    per_policy(report, |_, r| match r.paired_vs_best_single {
        Some(p) => format!(
            "{:.2}x [{:.2}-{:.2}]{}",
            p.median,
            p.low,
            p.high,
            if p.high < LOSS_BELOW { " loss" } else { "" }
        ),
        None => "n/a".to_string(),
    })
}

/// The whole Markdown report.
pub fn markdown(report: &BenchReport, chart: Option<&str>) -> String {
    let m = &report.machine;
    let files = report.sizes.first().map_or(0, |s| s.files);
    let mut md = format!(
        "# hetcrypt bench: {} {}, {} file{} per size, median of {} run{}\n\n",
        report.cipher,
        report.direction,
        files,
        plural(files),
        report.reps,
        plural(report.reps as usize)
    );
    md.push_str(&format!(
        "- Machine: Linux {}, {} core{}, {}, hetcrypt {}\n",
        m.kernel,
        m.cores,
        plural(m.cores),
        m.openssl,
        m.hetcrypt
    ));
    for e in &report.engines {
        let mut drivers: Vec<String> = e
            .ciphers
            .iter()
            .filter(|c| c.cipher == report.cipher)
            .map(|c| c.driver.clone())
            .collect();
        drivers.dedup();
        md.push_str(&format!(
            "- Engine {}: {} lane{}, {} served by {}\n",
            e.name,
            e.lanes,
            plural(e.lanes),
            report.cipher,
            if drivers.is_empty() {
                "(not supported)".to_string()
            } else {
                drivers.join(", ")
            }
        ));
    }
    for u in &report.unavailable {
        md.push_str(&format!("- Not available: {}: {}\n", u.engine, u.reason));
    }
    for s in &report.skipped {
        md.push_str(&format!("- Skipped {}: {}\n", s.policy, s.reason));
    }
    md.push_str(&format!("- Files: {}\n", report.input));
    md.push_str(&format!("- Timing: {}\n", report.timing));
    for n in &report.notes {
        md.push_str(&format!("- {n}\n"));
    }

    md.push_str(&format!(
        "\n## Table A: time per policy (ms; median, min-max of {} run{})\n\n",
        report.reps,
        plural(report.reps as usize)
    ));
    md.push_str(&time_table(report).markdown());
    md.push_str("\n## Table B: jobs done by each engine (the median run)\n\n");
    md.push_str(&jobs_table(report).markdown());
    md.push_str(
        "\n## Table C: speed-up against only:cpu / against the best single engine / \
         efficiency against the ideal combination\n\n\
         The ideal combination T* keeps every engine busy until the end: \
         1/T* = sum over engines of 1/T(only:engine). 100% means T = T*.\n\n",
    );
    md.push_str(&comparison_table(report).markdown());
    let mut ideal = Grid::new(["size", "best single engine", "ideal T* (ms)"]).right_align_from(2);
    for s in &report.sizes {
        ideal.row([
            human_size(s.size),
            s.best_single.clone().unwrap_or_else(|| "n/a".into()),
            s.ideal_s.map_or_else(|| "n/a".into(), fmt_ms),
        ]);
    }
    md.push('\n');
    md.push_str(&ideal.markdown());
    let confidence = report
        .sizes
        .iter()
        .flat_map(|s| &s.policies)
        .find_map(|p| p.paired_vs_best_single)
        .map_or(0.0, |p| p.confidence);
    md.push_str(&format!(
        "\n## Table D: speed-up against the best single engine, paired run by run\n\n\
         Each run of a policy is compared with the best single engine's run of the same \
         round (each policy runs once per round, in a shuffled order, so each pair saw \
         nearly the same machine state): median of those ratios [its {:.0}% confidence \
         interval, from order statistics]. \"loss\" marks an interval wholly below {LOSS_BELOW}x: slower than \
         the best single engine beyond measurement noise.\n\n",
        confidence * 100.0
    ));
    md.push_str(&paired_table(report).markdown());
    if let Some(chart) = chart {
        md.push_str(&format!(
            "\n## Time against file size\n\n![time per policy against file size]({chart})\n"
        ));
    }
    md
}
