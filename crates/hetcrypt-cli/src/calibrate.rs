//! `hetcrypt calibrate`: measures what each engine costs per cipher, direction and size
//! on this machine and stores it where policies, `bench`, `encrypt` and the OpenSSL
//! provider read it; `--show` prints what is stored.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use hetcrypt::calibration::{self, Calibration, Fingerprint, Loaded, Settings, Step};
use hetcrypt::engine::EngineKind;
use hetcrypt::policy::{self, Policy};
use hetcrypt::{Cipher, Direction};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::output::Grid;
use crate::workload::{human_size, parse_cipher, EngineOpts, EngineSet};

/// Debug builds only: time each point for this many microseconds instead of the
/// library's 20 ms, so the CLI tests (which check what is stored, shown and read, not
/// the figures: those are the library's tests) calibrate in milliseconds.
const TEST_POINT_TIME_US: &str = "HETCRYPT_TEST_POINT_TIME_US";

/// Arguments of `hetcrypt calibrate`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Measures every engine of this machine (each `kernel:<driver>` too) alone, lane by lane,
with no policy in between: for each cipher in each direction, one request at a time at
16 B, 64 B, 256 B, 1 KiB, 4 KiB, 16 KiB and 64 KiB (the median of at least 20 ms of
requests each), fitted as a fixed cost per request plus a cost per byte; then 16 KiB
requests with 1, 2, 4, ... lanes in flight; then the cpu beside each other engine, each
alone and both at once at every size, which says whether mixing them gains. From those
it derives the crossover sizes: from which job size an engine moves bytes at least as
fast as the cpu.

The result goes to one store that every part of hetcrypt reads: the `threshold` policy
splits at the stored crossover, `adaptive` starts from the stored costs and mix gains
(and keeps learning), the OpenSSL provider decides per call between the CPU and the module,
and `bench` and `speed` run each device engine (kernel, devcrypto) with the lanes its sweep
chose (1, 2, 4 in flight, each count's median of 5 windows taken in turn; more lanes only
where they beat fewer by 15%, at most 2); `engines` and `--show` say how many.
The store is, in this order: --calibration FILE; $HETCRYPT_CALIBRATION; for root
/var/lib/hetcrypt/calibration.json; else $XDG_STATE_HOME/hetcrypt/calibration.json or
~/.local/state/hetcrypt/calibration.json (a user without one reads root's). It is
written atomically (a temporary file renamed into place), so two calibrations at once
leave one whole file.

A store is kept for the machine it measured: another CPU or CPU flags, kernel, AES
driver or driver priority, OpenSSL or hetcrypt version makes it stale. Every reader
then warns once and goes on without it; run `hetcrypt calibrate` again.

In the QEMU testbed (the module against a CPU without AES instructions):
  testbed/run --profile soft -- hetcrypt calibrate
Takes a few seconds on a host, well under a minute in the testbed guest."
)]
pub struct Args {
    /// Print what is stored instead of measuring.
    #[arg(long)]
    show: bool,
    /// Print JSON (the store's contents) instead of tables.
    #[arg(long)]
    json: bool,
    /// The store file [default: see below].
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
    /// Engines to measure (comma-separated) [default: every engine this machine has].
    #[arg(
        long = "engines",
        visible_alias = "engine",
        value_name = "ENGINES",
        value_delimiter = ','
    )]
    engines: Vec<String>,
    /// Ciphers to measure, each in both directions (comma-separated) [default:
    /// aes-{128,256}-{cbc,ctr,gcm}; padded CBC is answered from raw CBC].
    #[arg(long = "cipher", visible_alias = "ciphers", value_name = "CIPHERS", value_delimiter = ',', value_parser = parse_cipher)]
    ciphers: Vec<Cipher>,
    /// Lanes per engine, the most the lanes sweep tries [default: each engine's own, and
    /// at least 4 on a device engine, whose count the sweep then chooses].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    lanes: Option<u16>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs `hetcrypt calibrate`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Some(path) = calibration::store_path(args.calibration.as_deref()) else {
        bail!(
            "no place for the calibration store: HOME is not set; name one with --calibration FILE"
        );
    };
    if args.show {
        return show(&args, &path);
    }
    // Fail on a store that cannot be written before spending seconds measuring.
    writable(&path)?;
    // Engines measured with their defaults, never with an older store's lane counts.
    let opts = EngineOpts {
        lanes: args.lanes.map(usize::from),
        ..EngineOpts::default()
    };
    let set = EngineSet::named_or_all(&args.engines, opts.clone())?;
    if set.ready.is_empty() {
        bail!("no engine is available on this machine");
    }
    let mut settings = Settings::default();
    if let Some(n) = opts.lanes {
        // --lanes is the most the sweep tries, on offload engines too.
        settings.offload_lanes = n;
    }
    if !args.ciphers.is_empty() {
        settings.ciphers = args.ciphers.clone();
        settings.ciphers.dedup();
    }
    if cfg!(debug_assertions) {
        if let Some(us) = std::env::var(TEST_POINT_TIME_US)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            settings.point_time = std::time::Duration::from_micros(us);
        }
    }
    let bar = progress(args.quiet);
    let cal = calibration::measure(&set.ready, &settings, &mut |p| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        let step = match p.step {
            Step::Size(n) => human_size(n),
            Step::Lanes(n) => format!("{n} lane{}", crate::workload::plural(n)),
            Step::Together(n) => format!("{} side by side", human_size(n)),
            _ => String::new(),
        };
        bar.set_message(format!("{} {} {} {step}", p.engine, p.cipher, p.direction));
    })
    .context("calibration failed")?;
    bar.finish_and_clear();
    if cal.engines.is_empty() {
        let why: Vec<String> = cal
            .unmeasured
            .iter()
            .map(|u| format!("{}: {}", u.engine, u.reason))
            .collect();
        bail!("no engine could be measured ({})", why.join("; "));
    }
    cal.save(&path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cal)?);
    } else {
        print!("{}", render(&cal, &path, None));
    }
    if !args.quiet {
        eprintln!("hetcrypt: calibration stored in {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a store can be written at `path`: its directory can be made and hold a
/// new file (what [`Calibration::save`] needs).
fn writable(path: &Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)
        .and_then(|()| {
            tempfile::Builder::new()
                .prefix(".calibration.")
                .tempfile_in(dir)
        })
        .map(drop)
        .with_context(|| format!("cannot write the calibration store {}", path.display()))
}

/// `--show`: the stored calibration, with a warning first if it no longer holds here.
fn show(args: &Args, path: &Path) -> anyhow::Result<ExitCode> {
    let (path, loaded) = if args.calibration.is_some() {
        let now = Fingerprint::current();
        (path.to_path_buf(), calibration::load(path, &now))
    } else {
        calibration::load_store(None, &Fingerprint::current())
    };
    let (cal, stale) = match loaded {
        Loaded::Ok(cal) => (*cal, None),
        Loaded::Missing => bail!(
            "no calibration stored in {}; run `hetcrypt calibrate` to measure this machine",
            path.display()
        ),
        Loaded::Stale { why } => {
            // Still worth showing: it is a well-formed store, just not for this machine.
            let text =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            match serde_json::from_slice::<Calibration>(&text) {
                Ok(cal) => (cal, Some(why)),
                Err(_) => bail!(
                    "{}",
                    Loaded::Stale { why }
                        .warning(&path)
                        .unwrap_or_else(|| "the store is stale".into())
                ),
            }
        }
        other => bail!(
            "{}",
            other
                .warning(&path)
                .unwrap_or_else(|| format!("cannot read {}", path.display()))
        ),
    };
    if let Some(why) = &stale {
        eprintln!(
            "hetcrypt: the calibration in {} does not hold on this machine: {why}; run `hetcrypt calibrate` to measure it again",
            path.display()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cal)?);
    } else {
        print!("{}", render(&cal, &path, stale.as_deref()));
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the policies of `bench`, `speed`, `encrypt` and `decrypt` by name, giving
/// those that use one (`threshold`, `adaptive`) the calibration store: read once, when
/// the first of them is built, with one warning on stderr if it is stale, foreign,
/// corrupt or unreadable (they then learn from nothing, as without a store).
pub struct Policies {
    explicit: Option<PathBuf>,
    loaded: Option<Option<(PathBuf, Arc<Calibration>)>>,
}

impl Policies {
    /// Policies from the store at `explicit`, or at the default place.
    pub fn new(explicit: Option<&Path>) -> Self {
        Policies {
            explicit: explicit.map(Path::to_path_buf),
            loaded: None,
        }
    }

    /// The policy named `name`.
    pub fn by_name(&mut self, name: &str) -> hetcrypt::Result<Box<dyn Policy>> {
        if !policy::uses_calibration(name) {
            return policy::by_name(name);
        }
        policy::by_name_with(name, self.load().map(|(_, c)| c))
    }

    /// The store itself (loaded on first use, with its warning), if there is one that
    /// holds on this machine.
    pub fn calibration(&mut self) -> Option<Arc<Calibration>> {
        self.load().map(|(_, c)| Arc::clone(c))
    }

    fn load(&mut self) -> Option<&(PathBuf, Arc<Calibration>)> {
        let explicit = self.explicit.as_deref();
        self.loaded
            .get_or_insert_with(|| {
                let (path, loaded) = calibration::load_store(explicit, &Fingerprint::current());
                if let Some(warning) = loaded.warning(&path) {
                    eprintln!("hetcrypt: {warning}");
                }
                loaded.calibration().map(|c| (path, Arc::new(c)))
            })
            .as_ref()
    }

    /// The store the policies (or device lanes) built so far started from, if any did.
    pub fn store(&self) -> Option<&Path> {
        self.loaded.as_ref()?.as_ref().map(|(p, _)| p.as_path())
    }
}

/// A progress bar on stderr, hidden when quiet or not on a terminal.
fn progress(quiet: bool) -> ProgressBar {
    let bar = ProgressBar::new(0);
    if quiet || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    } else {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:30} {pos}/{len} points, {elapsed} {msg}")
        {
            bar.set_style(style);
        }
    }
    bar
}

/// Seconds as people read a request's cost: `850 ns`, `12.3 µs`, `1.45 ms`.
fn human_time(secs: f64) -> String {
    if secs < 1e-6 {
        format!("{:.0} ns", secs * 1e9)
    } else if secs < 1e-3 {
        format!("{:.1} µs", secs * 1e6)
    } else {
        format!("{:.2} ms", secs * 1e3)
    }
}

/// Bytes per second as MB/s (10^6, as `openssl speed` counts).
fn mb_per_s(bytes_per_second: f64) -> String {
    let mb = bytes_per_second / 1e6;
    if mb >= 100.0 {
        format!("{mb:.0}")
    } else if mb >= 1.0 {
        format!("{mb:.1}")
    } else {
        format!("{mb:.2}")
    }
}

/// The tables: cost per engine and class, then the crossovers.
fn render(cal: &Calibration, path: &Path, stale: Option<&str>) -> String {
    let f = &cal.fingerprint;
    let age = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .saturating_sub(cal.measured_at);
    let mut out = format!(
        "Calibration in {} ({}), measured {} ago on Linux {}, {}, {}:\n\n",
        path.display(),
        if stale.is_some() {
            "STALE: not for this machine"
        } else {
            "holds on this machine"
        },
        human_age(age),
        f.kernel,
        if f.cpu_model.is_empty() {
            "unknown CPU"
        } else {
            &f.cpu_model
        },
        f.openssl,
    );
    // Every size any class measured, in order, one column each.
    let mut sizes: Vec<usize> = cal
        .engines
        .iter()
        .flat_map(|e| &e.classes)
        .flat_map(|c| c.points.iter().map(|p| p.len))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut header: Vec<String> = [
        "ENGINE",
        "CIPHER",
        "DIRECTION",
        "DRIVER",
        "FIXED",
        "PER KIB",
    ]
    .map(String::from)
    .to_vec();
    header.extend(sizes.iter().map(|&n| human_size(n)));
    header.push("LANES (MB/s)".into());
    let mut grid = Grid::new(header).right_align_from(4);
    for e in &cal.engines {
        for c in &e.classes {
            let driver = short_driver(&c.driver);
            let mut row = vec![
                e.name.clone(),
                c.cipher.to_string(),
                c.direction.to_string(),
                match c.priority {
                    Some(p) => format!("{driver} [{p}]"),
                    None => driver.to_string(),
                },
                human_time(c.fixed),
                human_time(c.per_byte * 1024.0),
            ];
            row.extend(sizes.iter().map(|&n| {
                c.points
                    .iter()
                    .find(|p| p.len == n)
                    .filter(|p| p.wall > 0.0)
                    .map_or_else(|| "-".into(), |p| mb_per_s(p.len as f64 / p.wall))
            }));
            let mut sweep = c
                .lanes
                .iter()
                .map(|l| format!("{}: {}", l.lanes, mb_per_s(l.bytes_per_second)))
                .collect::<Vec<_>>()
                .join(", ");
            if e.kind != EngineKind::Cpu {
                if let Some(best) = c.best_lanes() {
                    sweep.push_str(&format!(" -> {best}"));
                }
            }
            row.push(sweep);
            grid.row(row);
        }
    }
    out.push_str(&grid.plain());
    out.push_str(&format!(
        "\nMB/s of one lane, one request at a time; FIXED + PER KIB is the fitted cost of one \
         request; LANES: MB/s with that many lanes in flight at 16 KiB (median of alternating \
         windows), and (-> N) the lanes a device engine runs from this store: more lanes only \
         where they beat fewer by {:.0}% or more, at most {}.\n",
        calibration::LANES_MARGIN * 100.0,
        calibration::MAX_CHOSEN_LANES
    ));
    let crossovers = crossover_rows(cal);
    if !crossovers.is_empty() {
        out.push_str("\nCrossovers (from this job size up, the engine moves bytes at least as fast as the cpu):\n\n");
        let mut grid =
            Grid::new(["CIPHER", "DIRECTION", "CPU", "ENGINE", "FROM"]).right_align_from(4);
        for row in crossovers {
            grid.row(row);
        }
        out.push_str(&grid.plain());
    }
    if !cal.mixes.is_empty() {
        out.push_str(
            "\nSide by side (both engines' MB/s together over the better one's alone; below 1 \
             the mix loses):\n\n",
        );
        let mut header: Vec<String> = ["CIPHER", "DIRECTION", "ENGINES"]
            .map(String::from)
            .to_vec();
        header.extend(sizes.iter().map(|&n| human_size(n)));
        let mut grid = Grid::new(header).right_align_from(3);
        for m in &cal.mixes {
            let mut row = vec![
                m.cipher.to_string(),
                m.direction.to_string(),
                format!("{} + {}", m.engines[0], m.engines[1]),
            ];
            row.extend(sizes.iter().map(|&n| {
                m.points
                    .iter()
                    .find(|p| p.len == n)
                    .and_then(|p| {
                        let best = p.alone[0].max(p.alone[1]);
                        (best > 0.0)
                            .then(|| format!("{:.2}x", (p.together[0] + p.together[1]) / best))
                    })
                    .unwrap_or_else(|| "-".into())
            }));
            grid.row(row);
        }
        out.push_str(&grid.plain());
    }
    if !cal.unmeasured.is_empty() {
        out.push_str("\nNot measured:\n");
        for u in &cal.unmeasured {
            out.push_str(&format!("  {}: {}\n", u.engine, u.reason));
        }
    }
    out
}

/// A driver as the table shows it: the kernel driver's name, or which library the cpu
/// engine uses (its full description, with versions, is in the JSON).
fn short_driver(driver: &str) -> &str {
    if driver.contains(" EVP ") {
        "OpenSSL EVP"
    } else if driver.starts_with("aes crate") {
        "aes crate"
    } else {
        driver.split(" (").next().unwrap_or(driver)
    }
}

/// One row per cipher, direction and (cpu-kind engine, other engine) pair measured.
fn crossover_rows(cal: &Calibration) -> Vec<[String; 5]> {
    let mut rows = Vec::new();
    let cpus = cal.engines.iter().filter(|e| e.kind == EngineKind::Cpu);
    for cpu in cpus {
        for c in &cpu.classes {
            for other in cal.engines.iter().filter(|e| e.name != cpu.name) {
                let Some(at) = cal.crossover(c.cipher, c.direction, &cpu.name, &other.name) else {
                    continue;
                };
                let from = match at {
                    0 => "always".to_string(),
                    usize::MAX => "never".to_string(),
                    n => human_size(round_size(n)),
                };
                rows.push([
                    c.cipher.to_string(),
                    c.direction.to_string(),
                    cpu.name.clone(),
                    other.name.clone(),
                    from,
                ]);
            }
        }
    }
    rows.sort_by(|a, b| (&a[0], dir_order(&a[1]), &a[3]).cmp(&(&b[0], dir_order(&b[1]), &b[3])));
    rows
}

/// Encrypt before decrypt.
fn dir_order(d: &str) -> bool {
    d != Direction::Encrypt.to_string()
}

/// A crossover rounded to two significant figures in binary units (a fitted line's
/// crossing is no more precise than that).
fn round_size(n: usize) -> usize {
    let unit = if n >= 1 << 20 {
        1 << 14
    } else if n >= 1 << 10 {
        1 << 8
    } else {
        1
    };
    n.div_ceil(unit) * unit
}

/// An age in the largest unit that fits: `12 s`, `5 min`, `3 h`, `2 days`.
fn human_age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s < 2 * 86400 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_well() {
        assert_eq!(human_time(850e-9), "850 ns");
        assert_eq!(human_time(12.34e-6), "12.3 µs");
        assert_eq!(human_time(1.456e-3), "1.46 ms");
        assert_eq!(human_age(30), "30 s");
        assert_eq!(human_age(3 * 3600), "3 h");
        assert_eq!(round_size(1900), 2048);
        assert_eq!(round_size(700), 700);
    }
}
