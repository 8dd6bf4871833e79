//! Requests per second of the two kernel paths, lane by lane (no dispatcher): the
//! `kernel` engine (AF_ALG) and the `devcrypto` engine (`/dev/crypto`) on one driver,
//! AES-128-CBC encryption of one buffer again and again, as `openssl speed` does; plus
//! what the engines' unplug looks cost: a `poll` of the device's held `uevent` (per
//! request) beside a look at its sysfs `driver` link (per request until the
//! twenty-fourth session, now once per `LINK_LOOK_INTERVAL`). Prints
//! `openssl speed` units (1000s of bytes per second) so the rows read beside
//! `openssl speed -elapsed -engine afalg -evp aes-128-cbc` in the same guest run.
//!
//! ```text
//! cargo build --release --example kernel_paths
//! testbed/run --profile soft --with target/release/examples/kernel_paths -- kernel_paths
//! ```
//!
//! Arguments (all optional): the driver (default `virtio_crypto_aes_cbc`), seconds per
//! size (default 1), the sizes (comma-separated; default `openssl speed`'s six), so that
//! one size at a time can take turns with `openssl speed -bytes N`, and which engines
//! (`kernel`, `devcrypto` or `both`, the default). Per size it also prints a `cpu` line:
//! requests, and this process's user and system CPU time per request (from
//! `/proc/self/stat`, in clock ticks), beside the wall time per request, so that where
//! a request's time goes can be set beside `openssl speed`'s (issue 20). The lane runs
//! until a timer thread raises a flag, as `openssl speed` runs until an alarm: no clock
//! read per request (`HETCRYPT_PATHS_STOP=clock` reads one per request, as before).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hetcrypt::engine::devcrypto::DevcryptoEngine;
use hetcrypt::engine::kernel::KernelEngine;
use hetcrypt::engine::EngineRef;
use hetcrypt::{Cipher, Direction, Job, JobOutput, Key, KeyStore};
use nix::fcntl::{open, AtFlags, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::stat::{fstatat, Mode};
use nix::unistd::{faccessat, AccessFlags};

#[path = "../tests/support/testbed_device.rs"]
mod testbed_device;

/// `openssl speed`'s block sizes.
const SIZES: [usize; 6] = [16, 64, 256, 1024, 8192, 16384];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let driver = args
        .next()
        .unwrap_or_else(|| "virtio_crypto_aes_cbc".to_string());
    let seconds: f64 = args.next().map_or(Ok(1.0), |s| s.parse())?;
    let sizes: Vec<usize> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => SIZES.to_vec(),
    };
    let which = args.next().unwrap_or_else(|| "both".to_string());
    let mut engines: Vec<EngineRef> = Vec::new();
    if which == "kernel" || which == "both" {
        engines.push(KernelEngine::with_driver(&driver)?.into_engine());
    }
    if which == "devcrypto" || which == "both" {
        engines.push(DevcryptoEngine::with_driver(&driver)?.into_engine());
    }
    let mut cpu_lines = Vec::new();
    // HETCRYPT_PATHS_STOP=clock: read the clock after every request to know when to
    // stop, as this example did up to the nineteenth session. In the TCG guest a clock
    // read is a system call (no vDSO clock source), one more per request than
    // `openssl speed` makes, which stops on an alarm.
    let clock_per_request = std::env::var("HETCRYPT_PATHS_STOP").is_ok_and(|v| v == "clock");
    print!("{:<40}", "type");
    for s in &sizes {
        print!(" {:>11}", format!("{s} bytes"));
    }
    println!();
    for engine in &engines {
        let keys = KeyStore::new();
        let key = keys.add(Key::new(vec![7; 16]))?;
        let mut lane = engine.open_lane(0)?;
        print!("{:<40}", format!("lane of {}", engine.name()));
        for &size in &sizes {
            let job = Job::new(
                Cipher::AES_128_CBC,
                Direction::Encrypt,
                key,
                [1; 16],
                vec![3; size],
            );
            let mut out = JobOutput::default();
            lane.run(&job, &keys, &mut out)?;
            let cpu0 = cpu_ticks()?;
            let t0 = Instant::now();
            let mut n = 0u64;
            if clock_per_request {
                while t0.elapsed() < Duration::from_secs_f64(seconds) {
                    lane.run(&job, &keys, &mut out)?;
                    n += 1;
                }
            } else {
                // As `openssl speed` stops on an alarm: a timer thread raises a flag,
                // and the loop reads no clock per request.
                let stop = Arc::new(AtomicBool::new(false));
                let timer = {
                    let stop = Arc::clone(&stop);
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_secs_f64(seconds));
                        stop.store(true, Ordering::Relaxed);
                    })
                };
                while !stop.load(Ordering::Relaxed) {
                    lane.run(&job, &keys, &mut out)?;
                    n += 1;
                }
                timer.join().map_err(|_| "timer thread panicked")?;
            }
            let wall = t0.elapsed().as_secs_f64();
            let cpu1 = cpu_ticks()?;
            let rate = (n * size as u64) as f64 / wall;
            print!(" {:>10.2}k", rate / 1000.0);
            let per = |ticks: u64| ticks as f64 / cpu1.2 * 1e6 / n.max(1) as f64;
            cpu_lines.push(format!(
                "cpu {} {size} B: {n} requests, user {:.1} us, sys {:.1} us, wall {:.1} us per request",
                engine.name(),
                per(cpu1.0 - cpu0.0),
                per(cpu1.1 - cpu0.1),
                wall * 1e6 / n.max(1) as f64
            ));
        }
        println!();
    }
    for line in &cpu_lines {
        println!("{line}");
    }
    // One look at a sysfs driver link, as the engines' unplug check made per request.
    if let Ok(dev) = std::env::var("HETCRYPT_TESTBED_CRYPTO_DEV") {
        let link = std::path::Path::new(&dev).join("driver");
        let t0 = Instant::now();
        let n = 2000;
        for _ in 0..n {
            let _ = std::fs::symlink_metadata(&link);
        }
        println!(
            "one lstat of {}: {:.1} us",
            link.display(),
            t0.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
        // What the engines do instead: `driver` relative to the directory held open.
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let dir = open(std::path::Path::new(&dev), flags, Mode::empty())?;
        let t0 = Instant::now();
        for _ in 0..n {
            let _ = fstatat(&dir, "driver", AtFlags::AT_SYMLINK_NOFOLLOW);
        }
        println!(
            "one fstatat(dir, \"driver\"): {:.1} us",
            t0.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
        // The look's candidates beside a call that does nothing, in alternating rounds
        // (the host's load moves single rounds): per call, median over the rounds.
        // The engines' per-request look: the crypto driver's own device's (`virtio0`)
        // `uevent`, held open; kernfs answers a `poll` on it with POLLERR once removed.
        let virtio = testbed_device::virtio_device(std::path::Path::new(&dev))?;
        let attr = std::fs::File::open(virtio.join("uevent"))?;
        let mut buf = [0u8; 256];
        let rounds = 7;
        let mut per: [Vec<f64>; 6] = Default::default();
        for _ in 0..rounds {
            for (i, v) in per.iter_mut().enumerate() {
                let t0 = Instant::now();
                for _ in 0..n {
                    match i {
                        0 => drop(nix::unistd::getppid()),
                        3 => drop(std::hint::black_box(Instant::now())),
                        4 => {
                            let mut fds = [PollFd::new(attr.as_fd(), PollFlags::POLLPRI)];
                            let _ = poll(&mut fds, PollTimeout::ZERO);
                        }
                        5 => drop(nix::sys::uio::pread(&attr, &mut buf, 0)),
                        1 => drop(fstatat(&dir, "driver", AtFlags::AT_SYMLINK_NOFOLLOW)),
                        _ => drop(faccessat(
                            &dir,
                            "driver",
                            AccessFlags::F_OK,
                            AtFlags::AT_EACCESS | AtFlags::AT_SYMLINK_NOFOLLOW,
                        )),
                    }
                }
                v.push(t0.elapsed().as_secs_f64() * 1e6 / f64::from(n));
            }
        }
        for (name, v) in [
            "getppid()",
            "fstatat(dir, \"driver\")",
            "faccessat2(dir, \"driver\")",
            "clock read (Instant::now)",
            "poll(virtio0/uevent)",
            "pread(virtio0/uevent)",
        ]
        .iter()
        .zip(per.iter_mut())
        {
            v.sort_by(f64::total_cmp);
            println!(
                "median of {rounds} rounds: one {name}: {:.2} us (range {:.2}-{:.2})",
                v[v.len() / 2],
                v[0],
                v[v.len() - 1]
            );
        }
    }
    Ok(())
}

/// This process's user and system CPU time so far, in clock ticks, and ticks per second
/// (`/proc/self/stat` fields 14 and 15).
fn cpu_ticks() -> Result<(u64, u64, f64), Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')').ok_or("odd /proc/self/stat")?.1;
    let mut f = rest.split_whitespace().skip(11);
    let user: u64 = f.next().ok_or("no utime")?.parse()?;
    let sys: u64 = f.next().ok_or("no stime")?.parse()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.ok_or("no CLK_TCK")?;
    Ok((user, sys, hz as f64))
}
