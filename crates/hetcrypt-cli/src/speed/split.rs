//! `hetcrypt speed --split`: one large buffer cut into block ranges run on 1, 2, ...
//! lanes at once (seed 003: 64 MB of AES-128-CTR over threads), with the speed-up.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use hetcrypt::cipher::BLOCK_LEN;
use hetcrypt::policy::Pull;
use hetcrypt::split;
use hetcrypt::{Cipher, Direction, Dispatcher, JobOutput};
use serde::Serialize;

use super::Args;
use crate::output::Grid;
use crate::workload::{
    human_size, open_engine, random_bytes, random_key, EngineOpts, Machine, Workload,
};

/// One lane count's result.
#[derive(Debug, Serialize)]
struct SplitRow {
    lanes: usize,
    pieces: usize,
    median_s: f64,
    min_s: f64,
    max_s: f64,
    bytes_per_second: f64,
    /// Median time with one lane over median time with this many.
    speedup: f64,
}

/// The JSON of `hetcrypt speed --split --json`.
#[derive(Serialize)]
struct SplitReport {
    machine: Machine,
    engine: String,
    cipher: Cipher,
    direction: Direction,
    size: usize,
    reps: u32,
    rows: Vec<SplitRow>,
}

/// Runs `hetcrypt speed --split`.
pub(super) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let cipher = args.cipher.unwrap_or(Cipher::AES_128_CTR);
    let direction = if args.decrypt {
        Direction::Decrypt
    } else {
        Direction::Encrypt
    };
    if !args.policies.is_empty() {
        bail!("--split runs one engine; give it with --engine, not --policy");
    }
    let engine_name = match args.engines.as_slice() {
        [] => "cpu".to_string(),
        [one] => one.clone(),
        _ => bail!("--split runs one engine at a time; give a single --engine"),
    };
    if args.size < BLOCK_LEN {
        bail!("--size must be at least one {BLOCK_LEN}-byte block");
    }
    let max_lanes = args
        .lanes
        .map_or_else(hetcrypt::engine::cpu::available_cores, usize::from);

    let key = random_key(cipher)?;
    // Every dispatcher below registers this key first, so it has the same id in all.
    let key_id = hetcrypt::KeyId(0);
    let whole = Workload::new(
        cipher,
        direction,
        &key,
        key_id,
        vec![random_bytes(args.size)?],
    )?;
    let expected = &whole.expected[0];
    if let Err(e) = split::check_splittable(&whole.jobs[0]) {
        bail!(
            "--split needs aes-*-ctr, or aes-*-cbc with --decrypt: {e} (seed 003 split CTR); \
             a {cipher} {direction} job is run whole, many at a time, by `speed` without --split"
        );
    }

    let mut rows: Vec<SplitRow> = Vec::new();
    for lanes in 1..=max_lanes {
        let engine = open_engine(
            &engine_name,
            &EngineOpts {
                lanes: Some(lanes),
                cpu_chains: args.cpu_chains.map(usize::from),
                cpu_impl: args.cpu_impl,
                ..EngineOpts::default()
            },
        )?;
        let dispatcher = Dispatcher::new(vec![engine])?;
        if dispatcher.add_key(key.clone())? != key_id {
            bail!("internal error: the key id differs between dispatchers");
        }
        let pieces = split::split(&whole.jobs[0], lanes)?;
        // One untimed run opens the lanes.
        let warm = dispatcher.run(&pieces, &Pull)?;
        check(warm.outputs, expected, lanes)?;
        let mut walls = Vec::with_capacity(args.reps as usize);
        for _ in 0..args.reps {
            let batch = dispatcher.run(&pieces, &Pull)?;
            check(batch.outputs, expected, lanes)?;
            walls.push(batch.report.wall);
        }
        if let Some((engine, reason)) = dispatcher.failed_engines().into_iter().next() {
            bail!("engine {engine} failed during the split run: {reason}");
        }
        walls.sort();
        let median = median(&walls).as_secs_f64();
        let one = rows.first().map_or(median, |r| r.median_s);
        if !args.quiet {
            eprintln!(
                "Doing {engine_name} {cipher} {direction} of {} in {} piece(s) on {lanes} lane(s): median {:.2} ms",
                human_size(args.size),
                pieces.len(),
                median * 1e3
            );
        }
        rows.push(SplitRow {
            lanes,
            pieces: pieces.len(),
            median_s: median,
            min_s: walls.first().copied().unwrap_or_default().as_secs_f64(),
            max_s: walls.last().copied().unwrap_or_default().as_secs_f64(),
            bytes_per_second: args.size as f64 / median,
            speedup: one / median,
        });
    }

    let report = SplitReport {
        machine: Machine::now(),
        engine: engine_name,
        cipher,
        direction,
        size: args.size,
        reps: args.reps,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &SplitReport) -> String {
    let mut grid = Grid::new([
        "lanes",
        "pieces",
        "median ms",
        "min-max ms",
        "1000s of bytes/s",
        "speed-up",
    ])
    .right_align_from(0);
    for row in &r.rows {
        grid.row([
            row.lanes.to_string(),
            row.pieces.to_string(),
            format!("{:.2}", row.median_s * 1e3),
            format!("{:.2}-{:.2}", row.min_s * 1e3, row.max_s * 1e3),
            format!("{:.2}k", row.bytes_per_second / 1e3),
            format!("{:.2}x", row.speedup),
        ]);
    }
    format!(
        "hetcrypt speed --split: one {} {} {} buffer on {}, cut into block ranges over 1..{} \
         lanes (seed 003); median of {} runs, timed from lane start to join; outputs \
         checked against the cpu reference\n{}",
        human_size(r.size),
        r.cipher,
        r.direction,
        r.engine,
        r.rows.len(),
        r.reps,
        grid.plain()
    )
}

/// The median of sorted durations.
fn median(sorted: &[Duration]) -> Duration {
    match sorted.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2,
    }
}

/// Checks that the pieces' outputs, joined, are the whole job's output.
fn check(
    outputs: Vec<hetcrypt::Result<JobOutput>>,
    expected: &JobOutput,
    lanes: usize,
) -> anyhow::Result<()> {
    match split::join(outputs) {
        Ok(joined) if joined.data == expected.data => Ok(()),
        Ok(_) => bail!("the split run on {lanes} lane(s) differs from the cpu reference"),
        Err(e) => bail!("the split run on {lanes} lane(s) failed: {e}"),
    }
}
