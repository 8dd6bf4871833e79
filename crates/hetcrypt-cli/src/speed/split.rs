//! `hetcrypt speed --split`: one large buffer cut into block ranges run on 1, 2, ...
//! lanes at once (seed 003: 64 MB of AES-128-CTR over threads), with the speed-up.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use hetcrypt::cipher::BLOCK_LEN;
use hetcrypt::policy::Pull;
use hetcrypt::{Cipher, Direction, Dispatcher, Job, JobOutput, Mode};
use serde::Serialize;

use super::Args;
use crate::output::Grid;
use crate::workload::{human_size, open_engine, random_bytes, random_key, Machine, Workload};

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
    match (cipher.mode, direction) {
        (Mode::Ctr, _) | (Mode::Cbc, Direction::Decrypt) => {}
        (Mode::Cbc, Direction::Encrypt) => bail!(
            "--split needs CTR or CBC decryption: CBC encryption is one serial chain that \
             cannot be cut into independent pieces"
        ),
        _ => bail!(
            "--split takes aes-*-ctr, or aes-*-cbc with --decrypt ({cipher} cannot be cut into \
             independent pieces)"
        ),
    }
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
    let max_lanes = args.lanes.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    );

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

    let mut rows: Vec<SplitRow> = Vec::new();
    for lanes in 1..=max_lanes {
        let engine = open_engine(&engine_name, Some(lanes))?;
        let dispatcher = Dispatcher::new(vec![engine])?;
        if dispatcher.add_key(key.clone())? != key_id {
            bail!("internal error: the key id differs between dispatchers");
        }
        let pieces = split_job(&whole.jobs[0], lanes);
        // One untimed run opens the lanes.
        let warm = dispatcher.run(&pieces, &Pull)?;
        check(&warm.outputs, expected, lanes)?;
        let mut walls = Vec::with_capacity(args.reps as usize);
        for _ in 0..args.reps {
            let batch = dispatcher.run(&pieces, &Pull)?;
            check(&batch.outputs, expected, lanes)?;
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

/// Checks that the pieces' outputs, concatenated, are the whole job's output.
fn check(
    outputs: &[hetcrypt::Result<JobOutput>],
    expected: &JobOutput,
    lanes: usize,
) -> anyhow::Result<()> {
    let mut joined = Vec::with_capacity(expected.data.len());
    for (i, out) in outputs.iter().enumerate() {
        match out {
            Ok(o) => joined.extend_from_slice(&o.data),
            Err(e) => bail!("piece {i} of the split run on {lanes} lane(s) failed: {e}"),
        }
    }
    if joined != expected.data {
        bail!("the split run on {lanes} lane(s) differs from the cpu reference");
    }
    Ok(())
}

/// Cuts `job` into at most `pieces` jobs over consecutive whole-block ranges whose
/// outputs, concatenated, equal the whole job's output: for CTR each piece's counter
/// block is the first one's plus its block offset (128-bit big-endian, as the cipher
/// increments it); for CBC decryption each piece's IV is the ciphertext block before it.
///
/// Written here because it is a few lines of block arithmetic over `Job`; it moves to
/// the library if a second user appears.
fn split_job(job: &Job, pieces: usize) -> Vec<Job> {
    let blocks = job.len().div_ceil(BLOCK_LEN);
    let per_piece = blocks.div_ceil(pieces.max(1)).max(1) * BLOCK_LEN;
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    while start < job.len() {
        let end = (start + per_piece).min(job.len());
        let mut iv = [0u8; BLOCK_LEN];
        iv.copy_from_slice(job.iv());
        if start > 0 {
            iv = match job.cipher.mode {
                Mode::Ctr => {
                    let offset = (start / BLOCK_LEN) as u128;
                    u128::from_be_bytes(iv).wrapping_add(offset).to_be_bytes()
                }
                _ => {
                    let mut prev = [0u8; BLOCK_LEN];
                    prev.copy_from_slice(&job.input[start - BLOCK_LEN..start]);
                    prev
                }
            };
        }
        out.push(Job::new(
            job.cipher,
            job.direction,
            job.key,
            iv,
            job.input[start..end].to_vec(),
        ));
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetcrypt::engine::cpu::CpuEngine;
    use hetcrypt::Key;

    /// Splitting must not change the result: CTR with a counter about to carry into
    /// the high 64 bits, and CBC decryption, each against the unsplit job.
    #[test]
    fn pieces_concatenate_to_the_whole_output() {
        let d = Dispatcher::new(vec![CpuEngine::with_lanes(2).into_engine()]).unwrap();
        let key = d.add_key(Key::new(vec![9; 16])).unwrap();
        let input: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut carry_iv = [0u8; 16];
        carry_iv[8..].copy_from_slice(&[0xff; 8]);
        for (cipher, direction, iv, input) in [
            (
                Cipher::AES_128_CTR,
                Direction::Encrypt,
                carry_iv,
                input.clone(),
            ),
            (
                Cipher::AES_128_CBC,
                Direction::Decrypt,
                [3u8; 16],
                input[..992].to_vec(),
            ),
        ] {
            let whole = Job::new(cipher, direction, key, iv, input);
            let reference = d.run(std::slice::from_ref(&whole), &Pull).unwrap();
            let expected = reference.outputs[0].as_ref().unwrap();
            for n in [1, 2, 3, 7, 100] {
                let pieces = split_job(&whole, n);
                assert!(pieces.len() <= n);
                let got = d.run(&pieces, &Pull).unwrap();
                check(&got.outputs, expected, n).unwrap();
            }
        }
    }
}
