//! Where one `/dev/crypto` request's time goes, step by step, in one process: bare
//! `CIOCCRYPT` loops shaped like cryptodev's `tests/speed` (in place, one buffer) and
//! like the `devcrypto` engine (input to a separate output), each over one buffer and
//! over 256 KiB of distinct buffers (as `hetcrypt speed`'s batches), the same with the
//! engine's per-request unplug look up to the twenty-third session (one `faccessat2` of
//! the device's sysfs `driver` link; now a `poll` of its `uevent`), then the engine's lane, then the dispatcher (the `hetcrypt speed` path, and
//! batches of one job). The variants take turns in short slices, round after round, so
//! that a busy host's swings fall on all of them alike; each round's rates are divided
//! by the in-place loop's. Minor page faults per request are counted beside them.
//!
//! ```text
//! cargo build --release --example devcrypto_costs
//! testbed/run --profile soft --with target/release/examples/devcrypto_costs -- devcrypto_costs
//! ```
//!
//! Arguments (all optional): rounds (default 8), seconds per slice (default 0.25), and
//! the index of one variant to run alone (for `strace -c -f`).
//! AES-128-CBC encryption on `virtio_crypto_aes_cbc` (the kernel's first `cbc(aes)`
//! in the soft profile), at 1, 4 and 16 KiB.

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use hetcrypt::engine::devcrypto::DevcryptoEngine;
use hetcrypt::{policy, Cipher, Direction, Dispatcher, Job, JobOutput, Key, KeyStore};
use nix::fcntl::{open, AtFlags, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::stat::Mode;
use nix::unistd::{faccessat, AccessFlags};

#[path = "../tests/support/testbed_device.rs"]
mod testbed_device;

/// The driver measured (cryptodev reaches it only where the kernel ranks it first).
const DRIVER: &str = "virtio_crypto_aes_cbc";
/// Request sizes measured.
const SIZES: [usize; 3] = [1024, 4096, 16384];
/// Bytes of one dispatcher batch, as `hetcrypt speed` runs one lane.
const BATCH_BYTES: usize = 256 << 10;
/// cryptodev's id of AES-CBC (`crypto/cryptodev.h`).
const CRYPTO_AES_CBC: u32 = 11;

/// `struct session_op` (`crypto/cryptodev.h`).
#[repr(C)]
struct SessionOp {
    cipher: u32,
    mac: u32,
    keylen: u32,
    key: *const u8,
    mackeylen: u32,
    mackey: *const u8,
    ses: u32,
}

/// `struct crypt_op` (`crypto/cryptodev.h`).
#[repr(C)]
struct CryptOp {
    ses: u32,
    op: u16,
    flags: u16,
    len: u32,
    src: *const u8,
    dst: *mut u8,
    mac: *mut u8,
    iv: *mut u8,
}

nix::ioctl_readwrite!(ciocgsession, b'c', 102, SessionOp);
nix::ioctl_readwrite!(cioccrypt, b'c', 104, CryptOp);

/// The variants, in the order they take turns. "one buffer": every request reads (and
/// writes) the same memory, as `tests/speed` and `openssl speed` do; "256 KiB": the
/// requests walk through [`BATCH_BYTES`] of distinct inputs (and outputs), as
/// `hetcrypt speed` batches do.
const VARIANTS: [&str; 10] = [
    "bare ioctl, in place, one buffer (tests/speed)",
    "bare ioctl, input -> output, one buffer",
    "bare ioctl, in place, 256 KiB",
    "bare ioctl, input -> output, 256 KiB",
    "bare ioctl, in -> out, one buffer, + look",
    "engine lane (Lane::run), one buffer",
    "engine lane (Lane::run), 256 KiB",
    "dispatcher, 256 KiB batch (speed)",
    "dispatcher, 1-job batch, one buffer",
    "bare ioctl, in -> out, one buffer, + poll look",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(8), |s| s.parse())?;
    let slice = Duration::from_secs_f64(args.next().map_or(Ok(0.25), |s| s.parse())?);
    // A third argument runs that variant only (for `strace -c`).
    let only_variant: Option<usize> = args.next().map(|s| s.parse()).transpose()?;
    let key = [7u8; 16];

    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/crypto")?;
    let mut sop = SessionOp {
        cipher: CRYPTO_AES_CBC,
        mac: 0,
        keylen: 16,
        key: key.as_ptr(),
        mackeylen: 0,
        mackey: std::ptr::null(),
        ses: 0,
    };
    // SAFETY: `sop` is a valid `struct session_op` pointing at a 16-byte key.
    unsafe { ciocgsession(dev.as_raw_fd(), &mut sop) }?;
    let ses = sop.ses;
    let crypt = |src: *const u8, dst: *mut u8, len: usize| {
        let mut iv = [1u8; 16];
        let mut cop = CryptOp {
            ses,
            op: 0,
            flags: 0,
            len: len as u32,
            src,
            dst,
            mac: std::ptr::null_mut(),
            iv: iv.as_mut_ptr(),
        };
        // SAFETY: `src` and `dst` point to `len` live bytes (the callers' buffers),
        // `iv` to 16; the ioctl returns when the request is done.
        unsafe { cioccrypt(dev.as_raw_fd(), &mut cop) }.expect("CIOCCRYPT");
    };
    let sysfs = std::env::var("HETCRYPT_TESTBED_CRYPTO_DEV")
        .map_err(|_| "HETCRYPT_TESTBED_CRYPTO_DEV unset: run in the testbed guest")?;
    // The engine looks at the virtio device's own link; its PCI parent's is as cheap.
    let dir = open(
        Path::new(&sysfs),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;

    // The engines' per-request look since the twenty-fourth session: a `poll` of the
    // virtio device's own `uevent`, held open.
    let uevent =
        std::fs::File::open(testbed_device::virtio_device(Path::new(&sysfs))?.join("uevent"))?;

    let engine = DevcryptoEngine::with_driver(DRIVER)?
        .with_lanes(1)
        .into_engine();
    let keys = KeyStore::new();
    let key_id = keys.add(Key::new(key.to_vec()))?;
    let mut lane = engine.open_lane(0)?;
    let dispatcher = Dispatcher::new(vec![engine.clone()])?;
    let d_key = dispatcher.add_key(Key::new(key.to_vec()))?;
    let only = policy::by_name(&format!("only:{}", engine.name()))?;

    println!(
        "=== {} rounds of {:.2} s slices, AES-128-CBC encryption, {DRIVER}",
        rounds,
        slice.as_secs_f64()
    );
    for size in SIZES {
        let input = vec![3u8; size];
        let mut output = vec![0u8; size];
        let mut in_place = vec![3u8; size];
        let count = (BATCH_BYTES / size).max(1);
        // Distinct buffers, each its own allocation, as a batch's jobs are.
        let inputs: Vec<Vec<u8>> = (0..count).map(|i| vec![i as u8; size]).collect();
        let mut outputs_bare: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; size]).collect();
        let mut in_places: Vec<Vec<u8>> = (0..count).map(|i| vec![i as u8; size]).collect();
        let job = Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            key_id,
            [1; 16],
            input.clone(),
        );
        let mut out = JobOutput::default();
        let lane_jobs: Vec<Job> = inputs
            .iter()
            .map(|x| {
                Job::new(
                    Cipher::AES_128_CBC,
                    Direction::Encrypt,
                    key_id,
                    [1; 16],
                    x.clone(),
                )
            })
            .collect();
        let mut lane_outs: Vec<JobOutput> = (0..count).map(|_| JobOutput::default()).collect();
        let jobs: Vec<Job> = inputs
            .iter()
            .map(|x| {
                Job::new(
                    Cipher::AES_128_CBC,
                    Direction::Encrypt,
                    d_key,
                    [1; 16],
                    x.clone(),
                )
            })
            .collect();
        let one_job = [Job::new(
            Cipher::AES_128_CBC,
            Direction::Encrypt,
            d_key,
            [1; 16],
            input.clone(),
        )];
        let mut outputs = Vec::new();
        let mut one_output = Vec::new();
        dispatcher.run_into(&jobs, only.as_ref(), &mut outputs)?;
        dispatcher.run_into(&one_job, only.as_ref(), &mut one_output)?;
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
        // Minor page faults and requests per variant, over all rounds: a count the
        // host's load does not move.
        let mut faults = vec![(0i64, 0usize); VARIANTS.len()];
        let mut next = 0usize;
        for round in 0..rounds {
            // Rotate the starting variant so none always follows the same one.
            for k in 0..VARIANTS.len() {
                let v = (k + round) % VARIANTS.len();
                if only_variant.is_some_and(|o| o != v) {
                    continue;
                }
                let flt0 = minor_faults();
                let mut requests = 0usize;
                let t0 = Instant::now();
                let mut bytes = 0usize;
                while t0.elapsed() < slice {
                    next = (next + 1) % count;
                    match v {
                        0 => {
                            let p = in_place.as_mut_ptr();
                            crypt(p, p, size);
                        }
                        1 => crypt(input.as_ptr(), output.as_mut_ptr(), size),
                        2 => {
                            let p = in_places[next].as_mut_ptr();
                            crypt(p, p, size);
                        }
                        3 => crypt(inputs[next].as_ptr(), outputs_bare[next].as_mut_ptr(), size),
                        4 => {
                            let _ = faccessat(
                                &dir,
                                "driver",
                                AccessFlags::F_OK,
                                AtFlags::AT_EACCESS | AtFlags::AT_SYMLINK_NOFOLLOW,
                            );
                            crypt(input.as_ptr(), output.as_mut_ptr(), size);
                        }
                        5 => lane.run(&job, &keys, &mut out)?,
                        6 => lane.run(&lane_jobs[next], &keys, &mut lane_outs[next])?,
                        7 => {
                            let r = dispatcher.run_into(&jobs, only.as_ref(), &mut outputs)?;
                            bytes += r.bytes as usize - size;
                        }
                        8 => {
                            dispatcher.run_into(&one_job, only.as_ref(), &mut one_output)?;
                        }
                        _ => {
                            let mut fds = [PollFd::new(uevent.as_fd(), PollFlags::POLLPRI)];
                            let _ = poll(&mut fds, PollTimeout::ZERO);
                            crypt(input.as_ptr(), output.as_mut_ptr(), size);
                        }
                    }
                    bytes += size;
                    requests += if v == 7 { count } else { 1 };
                }
                faults[v].0 += minor_faults() - flt0;
                faults[v].1 += requests;
                rates[v].push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e3);
            }
        }
        println!("--- {size} bytes: rate in 1000s of bytes/s (median, range); ratio to the in-place loop (median of per-round ratios, range); minor faults per request");
        for (v, name) in VARIANTS.iter().enumerate() {
            if rates[v].is_empty() {
                continue;
            }
            let per = faults[v].0 as f64 / faults[v].1.max(1) as f64;
            let (rm, rlo, rhi) = summary(&rates[v]);
            if rates[0].is_empty() {
                println!("{name:<48} {rm:>10.0}k ({rlo:.0}-{rhi:.0})   faults {per:.3}");
                continue;
            }
            let ratios: Vec<f64> = rates[v].iter().zip(&rates[0]).map(|(a, b)| a / b).collect();
            let (qm, qlo, qhi) = summary(&ratios);
            println!("{name:<48} {rm:>10.0}k ({rlo:.0}-{rhi:.0})   {qm:.2} ({qlo:.2}-{qhi:.2})   faults {per:.3}");
        }
    }
    Ok(())
}

/// This process's minor page faults so far (0 if `getrusage` fails, which it does not
/// for this process).
fn minor_faults() -> i64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0, |u| u.minor_page_faults())
}

/// Median, minimum and maximum.
fn summary(xs: &[f64]) -> (f64, f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}
