//! What a run tells people: a progress bar while it works, a summary at the end
//! (files, bytes, time, each engine's share, every failure), or the same as JSON.

use std::time::Duration;

use hetcrypt_format::Stats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::plan::Note;

/// Runs shorter than this show no progress bar (it would only flicker).
const PROGRESS_AFTER: Duration = Duration::from_millis(500);

/// A progress bar on stderr with bytes/s (`hidden` when stderr is not a terminal or
/// when asked to be quiet); a spinner when the total is unknown (stdin).
pub fn progress(total: Option<u64>, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = if total.is_some() {
        "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}"
    } else {
        "{spinner} {bytes} {binary_bytes_per_sec}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(PROGRESS_AFTER);
    bar
}

/// The end-of-run summary.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// `encrypt` or `decrypt`.
    pub command: &'static str,
    /// The AEAD (encryption only: decryption reads it from each file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aead: Option<String>,
    /// The policy.
    pub policy: String,
    /// The engines used.
    pub engines: Vec<String>,
    /// Engines this machine lacks (when none were named).
    pub engines_unavailable: Vec<crate::workload::Unavailable>,
    /// Messages that went through.
    pub files_ok: usize,
    /// Messages that failed.
    pub files_failed: usize,
    /// Inputs skipped on purpose.
    pub files_skipped: usize,
    /// Plaintext bytes of the messages that went through.
    pub bytes: u64,
    /// Wall time of the whole run, in seconds.
    pub seconds: f64,
    /// Plaintext bytes per second over the whole run (I/O included).
    pub bytes_per_second: f64,
    /// What the dispatcher did, per engine.
    pub dispatch: Stats,
    /// File-system syncs made (`syncfs` per commit group and at the end, `fsync` of a
    /// tree's manifest): what made the outputs durable.
    pub syncs: u64,
    /// Peak resident memory of the process (the kernel's high-water mark, as
    /// `getrusage`'s `ru_maxrss`), in bytes; 0 where /proc is not there.
    pub peak_rss_bytes: u64,
    /// Every failure: path and reason.
    pub failed: Vec<Note>,
    /// Every skipped input: path and reason.
    pub skipped: Vec<Note>,
}

/// Text for a terminal: control characters (ESC, newline, DEL, C1) and the bidi
/// controls that reorder what is shown are written as escapes (`\u{1b}`, `\n`), so
/// a file name can neither move the cursor nor forge a line of the summary.
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    let risky =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(risky) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if risky(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `n` bytes for people (binary units).
fn human(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The process's peak resident memory in bytes: `VmHWM` of /proc/self/status (what
/// `getrusage` reports as `ru_maxrss`, without a system call binding); 0 if unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

impl Summary {
    /// The summary for people, several lines.
    pub fn render(&self) -> String {
        let verb = if self.command == "encrypt" {
            "encrypted"
        } else {
            "decrypted"
        };
        let mut s = format!(
            "hetcrypt: {verb} {} file{} ({}) in {:.2} s, {}/s",
            self.files_ok,
            if self.files_ok == 1 { "" } else { "s" },
            human(self.bytes as f64),
            self.seconds,
            human(self.bytes_per_second)
        );
        if let Some(aead) = &self.aead {
            s += &format!(" with {aead}");
        }
        s += &format!(", policy {}", self.policy);
        if self.files_failed > 0 {
            s += &format!("; {} FAILED", self.files_failed);
        }
        if self.files_skipped > 0 {
            s += &format!("; {} skipped", self.files_skipped);
        }
        s += &format!(
            "; {} sync{}, peak memory {}",
            self.syncs,
            if self.syncs == 1 { "" } else { "s" },
            human(self.peak_rss_bytes as f64)
        );
        s.push('\n');
        let total_jobs = self.dispatch.jobs.max(1) as f64;
        for e in &self.dispatch.engines {
            s += &format!(
                "  {:<28} {:>8} chunks {:>5.1}%  {:>10}  busy {:.2} s{}\n",
                e.name,
                e.jobs,
                100.0 * e.jobs as f64 / total_jobs,
                human(e.bytes as f64),
                e.busy_s,
                e.failed
                    .as_ref()
                    .map(|r| format!("  (failed: {r})"))
                    .unwrap_or_default()
            );
        }
        for u in &self.engines_unavailable {
            s += &format!("  {:<28} unavailable: {}\n", u.engine, u.reason);
        }
        for n in &self.failed {
            s += &format!("  failed:  {}: {}\n", escape(&n.path), escape(&n.reason));
        }
        for n in &self.skipped {
            s += &format!("  skipped: {}: {}\n", escape(&n.path), escape(&n.reason));
        }
        s
    }
}
