//! How busy the machine's CPUs are (from `/proc/stat`), and how much CPU the kernel's
//! threads spend for module calls: what the router weighs a module call's cost by.
//!
//! Written here rather than taken from a crate: the router needs one number (the share
//! of all CPUs' time not idle since the last sample), read a few times a second from
//! calls that already read the clock; `procfs` and `sysinfo` parse far more.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hetcrypt::policy::call::{FULL_LOAD, KERNEL_SHARE_UNIT, MAX_KERNEL_SHARE};

/// How often the load is sampled at most: often enough to follow a benchmark that
/// starts or stops within a second, rarely enough that reading `/proc/stat` (a few
/// microseconds) is lost among the calls.
pub const PERIOD: Duration = Duration::from_millis(100);

/// A `/proc` file kept open and read again from its start: one `pread` a sample. A
/// fresh read (`std::fs::read_to_string`) is five system calls (open, statx, two
/// reads, close), ~0.25 ms together in the soft guest under emulation; the samplers'
/// ~40 such reads a second cost `balanced` 1-2 system calls and ~50 us per 1 KiB
/// request there (strace on nginx's worker: 257 extra opens in 6 s, 1,359 requests).
/// `/proc`'s files render afresh on every read from offset 0.
pub struct ProcFile(File);

impl ProcFile {
    /// Opens `path`; `None` where it cannot be read.
    pub fn open(path: &str) -> Option<ProcFile> {
        File::open(path).ok().map(ProcFile)
    }

    /// The file's first `buf.len()` bytes as they are now (ASCII: a cut through a
    /// multi-byte character ends the text there); `None` where the read fails (the
    /// task is gone).
    pub fn read<'a>(&self, buf: &'a mut [u8]) -> Option<&'a str> {
        let n = self.0.read_at(buf, 0).ok()?;
        let text = &buf[..n];
        Some(match std::str::from_utf8(text) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&text[..e.valid_up_to()]).ok()?,
        })
    }
}

/// A running total shared by every process forked from the one that made it: the
/// callers' CPU time in module calls, which each process's [`KernelSampler`] weighs
/// the kernel threads' time against. The kernel threads work for every process's
/// module calls on a device; weighed against one process's calls alone, a server with
/// N workers (nginx's, forked from the master that loaded the provider) saw about N
/// times the kernel share in each. One anonymous shared page, made when the provider
/// loads; where it cannot be mapped, a count of this process's own.
pub struct SharedTotal(Total);

enum Total {
    /// In a `MAP_SHARED | MAP_ANONYMOUS` page of [`SHARED_LEN`] bytes, kept mapped
    /// until drop.
    Mapped(std::ptr::NonNull<AtomicU64>),
    Own(AtomicU64),
}

/// The shared mapping's length: one page (the smallest a mapping takes anyway).
const SHARED_LEN: usize = 4096;

// SAFETY: the pointer is to an `AtomicU64` in a mapping that lives as long as the
// `SharedTotal` (unmapped only in `drop`); every access goes through the atomic.
unsafe impl Send for SharedTotal {}
// SAFETY: as above: shared access is only ever atomic.
unsafe impl Sync for SharedTotal {}

impl SharedTotal {
    /// A fresh total of 0, shared with the children this process forks from now on.
    pub fn new() -> SharedTotal {
        // SAFETY: an anonymous mapping at an address of the kernel's choosing, no
        // file; the result is checked against MAP_FAILED before use. The kernel
        // zero-fills it and page alignment suits an `AtomicU64`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SHARED_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        match std::ptr::NonNull::new(p.cast::<AtomicU64>()) {
            Some(ptr) if p != libc::MAP_FAILED => SharedTotal(Total::Mapped(ptr)),
            _ => SharedTotal(Total::Own(AtomicU64::new(0))),
        }
    }

    /// Whether the total is shared with forked children (else this process's own).
    pub fn is_shared(&self) -> bool {
        matches!(self.0, Total::Mapped(_))
    }

    fn atomic(&self) -> &AtomicU64 {
        match &self.0 {
            // SAFETY: mapped, zero-initialised and aligned in `new`, unmapped only
            // in `drop`, so valid for `&self`'s lifetime.
            Total::Mapped(p) => unsafe { p.as_ref() },
            Total::Own(a) => a,
        }
    }

    /// Adds `ns`.
    pub fn add(&self, ns: u64) {
        self.atomic().fetch_add(ns, Ordering::Relaxed);
    }

    /// The total so far, every sharing process's additions included.
    pub fn get(&self) -> u64 {
        self.atomic().load(Ordering::Relaxed)
    }
}

impl Default for SharedTotal {
    fn default() -> Self {
        SharedTotal::new()
    }
}

impl Drop for SharedTotal {
    fn drop(&mut self) {
        if let Total::Mapped(p) = self.0 {
            // SAFETY: the mapping made in `new`, of that length; nothing refers to it
            // after `self` goes (`atomic` borrows `self`).
            unsafe {
                libc::munmap(p.as_ptr().cast(), SHARED_LEN);
            }
        }
    }
}

/// Bytes read of `/proc/stat`: its first line (`cpu ` and ten counters of at most 20
/// digits) fits with room to spare; the rest of the file is never needed.
const STAT_HEAD: usize = 512;

/// Bytes read of `/proc/PID/schedstat`: three counters of at most 20 digits.
pub const SCHEDSTAT_LEN: usize = 96;

/// `/proc/stat`'s all-CPU counters, in clock ticks: busy and total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticks {
    /// Everything but idle and I/O wait.
    pub busy: u64,
    /// Everything.
    pub total: u64,
}

/// Parses the first (`cpu `) line of `/proc/stat`: user nice system idle iowait irq
/// softirq steal (later fields, guest time, are already counted in user and nice).
pub fn parse_stat(stat: &str) -> Option<Ticks> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // A first line cut short (a read that ended inside it) must not pass as whole.
    if fields.len() < 4 || !stat.contains('\n') {
        return None;
    }
    let total: u64 = fields.iter().sum();
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    Some(Ticks {
        busy: total - idle,
        total,
    })
}

/// The share of CPU time busy between two samples, per mille ([`FULL_LOAD`]: all
/// busy); `None` if no tick passed (or the counters went back).
pub fn busy_between(before: Ticks, after: Ticks) -> Option<u32> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    if total == 0 {
        return None;
    }
    Some((busy.min(total) * u64::from(FULL_LOAD) / total) as u32)
}

/// The load sampler's state: `/proc/stat`, open, and the last sample.
#[derive(Default)]
struct LoadState {
    /// Opened at the first sample; `None` there where it cannot be opened.
    stat: Option<Option<ProcFile>>,
    last: Option<(Instant, Ticks)>,
}

/// Samples `/proc/stat` at most once per [`PERIOD`]; callers that find another
/// sampling skip it rather than wait.
#[derive(Default)]
pub struct LoadSampler {
    state: Mutex<LoadState>,
}

impl LoadSampler {
    /// The load since the last sample if a period has passed by `now`, else `None`
    /// (also where `/proc/stat` cannot be read: the router then sees no load).
    pub fn sample(&self, now: Instant) -> Option<u32> {
        let mut guard = self.state.try_lock().ok()?;
        let st = &mut *guard;
        if let Some((at, _)) = st.last {
            if now.saturating_duration_since(at) < PERIOD {
                return None;
            }
        }
        let stat = st
            .stat
            .get_or_insert_with(|| ProcFile::open("/proc/stat"))
            .as_ref()?;
        let mut buf = [0u8; STAT_HEAD];
        let ticks = parse_stat(stat.read(&mut buf)?)?;
        let busy = st.last.and_then(|(_, before)| busy_between(before, ticks));
        st.last = Some((now, ticks));
        busy
    }
}

/// How often the kernel's threads are read at most: half a second follows a change
/// of load within seconds; each read opens one file per kernel thread still watched
/// (see [`DROP_AFTER`]).
pub const KERNEL_PERIOD: Duration = Duration::from_millis(500);

/// A kernel thread that did not run in this many windows with module calls in a row
/// is no longer read (until the list is rebuilt): it does no work for the module.
/// Reading every kernel thread costs too much under emulation (0.3-0.6 ms a file in
/// the soft guest on a loaded host, ~40 kernel threads: 2-5% of its CPU every 0.5 s);
/// the few that run while the module does (its request thread, RCU, softirqs) stay.
pub const DROP_AFTER: u8 = 4;

/// A window longer than this is no window: no call reached the provider for that long
/// (the process sat idle), and what the kernel threads did meanwhile belongs to
/// whatever else ran, another process's module calls included. Its reads only start a
/// fresh window. In the side-by-side nginx runs (docs/https.md, nineteenth session) the
/// `balanced` instance's first window of each run spanned the `module` instance's run:
/// seconds of `virtio0-engine` against the 0.2 ms of one 16 KiB module call, a share in
/// the thousands that took the quarter-weight average ~10 s to forget, and the run's
/// 1 MiB responses went in-line meanwhile. Four periods: a process that calls at all
/// samples every period, and a pause of a second between requests still counts.
pub const STALE_AFTER: Duration = Duration::from_secs(2);

/// How often the list of kernel threads is rebuilt from `/proc` (every process's
/// `stat`): kernel threads come and go rarely (a driver's request thread lives as long
/// as its device).
pub const REDISCOVER: Duration = Duration::from_secs(30);

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags field: the task is a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Weight of a new window in the kernel-thread averages: 1/4, so one window with an
/// unrelated kernel job moves the share by a quarter and a real change shows within a
/// few windows.
const KERNEL_AVG_SHIFT: u32 = 2;

/// Whether a `/proc/PID/stat` line is a kernel thread's (its flags carry `PF_KTHREAD`).
/// The command name (in parentheses) may hold spaces and parentheses: fields are
/// counted from the last `)`.
pub fn is_kernel_thread(stat: &str) -> bool {
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    // state ppid pgrp session tty_nr tpgid flags
    rest.split_whitespace()
        .nth(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The CPU time a task has run, in ns: the first field of `/proc/PID/schedstat`.
pub fn run_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// The time a task has waited on a run queue (runnable, another task on its CPU), in
/// ns: the second field of `/proc/PID/schedstat`.
pub fn run_delay(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().nth(1)?.parse().ok()
}

/// One window's kernel work for module calls, ns: the kernel threads' CPU time
/// `kernel_ns` beyond their usual rate `baseline` (ns per ns of wall time, per
/// [`KERNEL_SHARE_UNIT`]) over `wall_ns`; below the usual rate, negative (the usual
/// rate is an average: a window under it is as much evidence as one above). At most
/// [`MAX_KERNEL_SHARE`] times the callers' CPU time `caller_ns` in module calls either
/// way: a window with a few module calls and an unrelated kernel job must not weigh
/// like many. `None` where no module call ran.
pub fn excess_of(kernel_ns: u64, wall_ns: u64, baseline: u64, caller_ns: u64) -> Option<i64> {
    if caller_ns == 0 {
        return None;
    }
    let usual = wall_ns.saturating_mul(baseline) / u64::from(KERNEL_SHARE_UNIT);
    let bound = i64::try_from(
        caller_ns.saturating_mul(u64::from(MAX_KERNEL_SHARE)) / u64::from(KERNEL_SHARE_UNIT),
    )
    .unwrap_or(i64::MAX);
    let signed = |ns: u64| i64::try_from(ns).unwrap_or(i64::MAX);
    Some(
        signed(kernel_ns)
            .saturating_sub(signed(usual))
            .clamp(-bound, bound),
    )
}

/// The kernel share, per [`KERNEL_SHARE_UNIT`], of summed windows: their kernel work
/// for module calls `excess` (ns) per ns of their callers' CPU time `caller` (none
/// below zero).
fn share_of_sums(excess: i64, caller: u64) -> u64 {
    u64::try_from(excess.max(0))
        .unwrap_or(0)
        .saturating_mul(u64::from(KERNEL_SHARE_UNIT))
        / caller.max(1)
}

fn average(old: Option<u64>, new: u64) -> u64 {
    match old {
        None => new,
        Some(old) => old - (old >> KERNEL_AVG_SHIFT) + (new >> KERNEL_AVG_SHIFT),
    }
}

/// What the kernel's threads did between two reads.
#[derive(Default)]
struct KernelState {
    /// The kernel threads watched, with the run time each had at the last read.
    threads: Vec<Watched>,
    /// When the list was built.
    found: Option<Instant>,
    /// The last read: when, and the callers' CPU time in module calls until then.
    last: Option<(Instant, u64)>,
    /// The kernel threads' CPU time per ns of wall time in windows without module
    /// calls, per [`KERNEL_SHARE_UNIT`] (their usual work: RCU, timers, ...).
    baseline: Option<u64>,
    /// The kernel share reported last.
    share: Option<u64>,
    /// The windows with module calls, each older one weighing a quarter less: their
    /// kernel work for module calls and their callers' CPU time in them, ns. The share
    /// is the one over the other, a ratio of sums: a window with a burst of checks
    /// (13 module calls in a 4-s run of the `balanced` nginx at 1 KiB) weighs by
    /// its calls, not as much as a window full of them. (An average of each window's
    /// ratio, clipped at zero, read 1.3-2.1 ns per ns there, against 0.6 in the
    /// `module` nginx's windows full of calls; twenty-seventh session.)
    sums: Option<(i64, u64)>,
    /// Watched threads' `schedstat`, kept open (at most [`MAX_KEPT`]).
    files: HashMap<u32, ProcFile>,
}

/// Watched threads whose `schedstat` stays open between reads: every kernel thread of
/// the testbed guest (40-52) fits, so no read there opens a file after the first
/// listing; a host with hundreds of kernel threads keeps no more descriptors than
/// this in its callers' process, and reads the rest afresh until they drop out
/// ([`DROP_AFTER`]). (At 32, the guest's other ~20 threads were opened again every
/// 0.5 s until they dropped: ~200 opens in a fresh nginx's first 5 s.)
const MAX_KEPT: usize = 64;

/// A watched thread's run time: from its kept `schedstat` where one is open, else
/// opened now (and kept, while fewer than [`MAX_KEPT`] are).
fn read_kept(files: &mut HashMap<u32, ProcFile>, pid: u32) -> Option<u64> {
    let mut buf = [0u8; SCHEDSTAT_LEN];
    if let Some(f) = files.get(&pid) {
        return run_ns(f.read(&mut buf)?);
    }
    let f = ProcFile::open(&format!("/proc/{pid}/schedstat"))?;
    let ns = run_ns(f.read(&mut buf)?);
    if files.len() < MAX_KEPT {
        files.insert(pid, f);
    }
    ns
}

/// Follows the CPU time of the machine's kernel threads against the CPU time callers
/// spend in module calls: how much of a module call's cost falls on other threads (a
/// driver's request thread such as crypto_engine's `virtio0-engine`, and in a QEMU
/// guest the device's emulation that runs on the vCPU). A caller's thread CPU time
/// alone (`CLOCK_THREAD_CPUTIME_ID`) misses it: in the `soft` testbed guest at 1 KiB,
/// 0.45 ms a call on the caller's thread and ~0.6 ms on `virtio0-engine`.
#[derive(Default)]
pub struct KernelSampler {
    state: Mutex<KernelState>,
}

/// One kernel thread watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watched {
    pid: u32,
    /// Its run time at the last read, ns.
    ns: u64,
    /// Windows with module calls in a row in which it did not run.
    idle: u8,
}

/// Takes each watched thread's new run time from `read` (`None`: it is gone): their
/// summed run time since the previous read. In a window with module calls
/// (`module_ran`), a thread that did not run counts one more idle window and goes after
/// [`DROP_AFTER`] in a row.
fn advance(
    threads: &mut Vec<Watched>,
    module_ran: bool,
    mut read: impl FnMut(u32) -> Option<u64>,
) -> u64 {
    let mut grown = 0;
    threads.retain_mut(|t| {
        let Some(now) = read(t.pid) else {
            return false;
        };
        let ran = now.saturating_sub(t.ns);
        grown += ran;
        t.ns = now;
        if ran > 0 {
            t.idle = 0;
        } else if module_ran {
            t.idle += 1;
        }
        t.idle < DROP_AFTER
    });
    grown
}

/// kthreadd, the parent of every kernel thread, where the process sees the host's PIDs.
const KTHREADD: u32 = 2;

/// The pids listed in a `/proc/PID/task/TID/children` file.
fn parse_pids(list: &str) -> Vec<u32> {
    list.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` is a kernel thread, by its `/proc/PID/stat`.
fn is_kernel_pid(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| is_kernel_thread(&s))
}

/// The kernel threads' pids: kthreadd's children where kthreadd is pid 2 and the
/// kernel lists children (`CONFIG_PROC_CHILDREN`), which reads two files instead of
/// every process's `stat` (a stall of tens of ms on the calling thread on a host with
/// thousands of processes); else every pid whose `stat` says kernel thread.
fn kernel_pids() -> Vec<u32> {
    if is_kernel_pid(KTHREADD) {
        let children = format!("/proc/{KTHREADD}/task/{KTHREADD}/children");
        if let Ok(list) = std::fs::read_to_string(children) {
            let pids = parse_pids(&list);
            if !pids.is_empty() {
                return pids;
            }
        }
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| is_kernel_pid(pid))
        .collect()
}

/// The kernel threads now, with their run times, read through `files` (a thread's
/// file stays open from one listing to the next while it lives, so a rebuilt list
/// opens only threads it did not hold).
fn find_threads(files: &mut HashMap<u32, ProcFile>) -> Vec<Watched> {
    let pids = kernel_pids();
    files.retain(|pid, _| pids.contains(pid));
    pids.into_iter()
        .filter_map(|pid| {
            Some(Watched {
                pid,
                ns: read_kept(files, pid)?,
                idle: 0,
            })
        })
        .collect()
}

impl KernelSampler {
    /// The kernel share (per [`KERNEL_SHARE_UNIT`]) if a [`KERNEL_PERIOD`] has passed
    /// by `now` and a module call ran since the last read; `caller_ns`: the callers'
    /// CPU time in module calls so far (a running total). Nothing is read before the
    /// first module call. `None` also where another caller is reading.
    pub fn sample(&self, now: Instant, caller_ns: u64) -> Option<u32> {
        if caller_ns == 0 {
            return None;
        }
        let mut guard = self.state.try_lock().ok()?;
        let st = &mut *guard;
        if let Some((at, _)) = st.last {
            if now.saturating_duration_since(at) < KERNEL_PERIOD {
                return None;
            }
        }
        let stale = st
            .found
            .is_none_or(|f| now.saturating_duration_since(f) >= REDISCOVER);
        let last = st.last.replace((now, caller_ns));
        let (Some((at, caller_before)), false) = (last, stale) else {
            // A fresh list starts a fresh window.
            st.threads = find_threads(&mut st.files);
            st.found = Some(now);
            return None;
        };
        let caller = caller_ns.saturating_sub(caller_before);
        let wall = now.saturating_duration_since(at);
        let files = &mut st.files;
        // (A stale window holds no evidence against a thread that stayed still.)
        let module_ran = caller > 0 && wall <= STALE_AFTER;
        let kernel_ns = advance(&mut st.threads, module_ran, |pid| read_kept(files, pid));
        let threads = &st.threads;
        files.retain(|pid, _| threads.iter().any(|t| t.pid == *pid));
        st.close_window(wall, caller, kernel_ns)
    }
}

impl KernelState {
    /// Folds one window, `wall` long, in which the callers spent `caller_ns` of CPU in
    /// module calls and the kernel threads ran `kernel_ns`: into the baseline where no
    /// module call ran, else into the share, which it returns (per
    /// [`KERNEL_SHARE_UNIT`]); a window longer than [`STALE_AFTER`] into neither. One
    /// window's share counts at most [`MAX_KERNEL_SHARE`] (what the router takes
    /// anyway): a window with a few module calls and unrelated kernel work must not
    /// hold the average up for long.
    fn close_window(&mut self, wall: Duration, caller_ns: u64, kernel_ns: u64) -> Option<u32> {
        if wall > STALE_AFTER {
            return None;
        }
        let wall_ns = wall.as_nanos() as u64;
        match excess_of(kernel_ns, wall_ns, self.baseline.unwrap_or(0), caller_ns) {
            None => {
                let rate = kernel_ns.saturating_mul(u64::from(KERNEL_SHARE_UNIT)) / wall_ns.max(1);
                self.baseline = Some(average(self.baseline, rate));
                None
            }
            Some(excess) => {
                let (e, c) = match self.sums {
                    None => (excess, caller_ns),
                    Some((e, c)) => (
                        e - (e >> KERNEL_AVG_SHIFT) + excess,
                        c - (c >> KERNEL_AVG_SHIFT) + caller_ns,
                    ),
                };
                self.sums = Some((e, c));
                let share = share_of_sums(e, c).min(u64::from(MAX_KERNEL_SHARE));
                self.share = Some(share);
                Some(share as u32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_all_cpu_line_gives_busy_and_total_ticks() {
        let stat = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\nintr 1\n";
        assert_eq!(
            parse_stat(stat),
            Some(Ticks {
                busy: 160,
                total: 1000
            })
        );
        assert_eq!(parse_stat("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_stat("cpu  1 2\n"), None);
        assert_eq!(parse_stat("cpu  1 x 3 4\n"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn the_load_is_the_busy_share_of_the_ticks_between_samples() {
        let a = Ticks {
            busy: 160,
            total: 1000,
        };
        let b = Ticks {
            busy: 310,
            total: 1200,
        };
        assert_eq!(busy_between(a, b), Some(750));
        assert_eq!(busy_between(a, a), None);
        assert_eq!(busy_between(b, a), None);
        let all = Ticks {
            busy: 360,
            total: 1200,
        };
        assert_eq!(busy_between(a, all), Some(FULL_LOAD));
    }

    #[test]
    fn samples_come_at_most_once_a_period() {
        let s = LoadSampler::default();
        let t0 = Instant::now();
        // The first read only sets the baseline; so does a read within the period.
        assert_eq!(s.sample(t0), None);
        assert_eq!(s.sample(t0 + PERIOD / 2), None);
        // A period later it reads /proc/stat again (whose ticks may or may not have
        // moved in real time: only the bound is certain) and keeps the new baseline.
        if let Some(busy) = s.sample(t0 + PERIOD + Duration::from_millis(20)) {
            assert!(busy <= FULL_LOAD);
        }
        let held = s.state.lock().unwrap().last.map(|(at, _)| at);
        assert_eq!(held, Some(t0 + PERIOD + Duration::from_millis(20)));
    }

    #[test]
    fn kernel_threads_are_told_by_their_flags_whatever_their_name() {
        // From a 6.1 guest: crypto_engine's thread for virtio-crypto, and nginx.
        let engine = "95 (virtio0-engine) S 2 0 0 0 -1 2129984 0 0 0 0 0 102 0 0 -2 0 1 0 310 0 0";
        let nginx = "147 (nginx) S 146 146 146 0 -1 4194624 1288 0 0 0 180 109 0 0 20 0 1 0";
        assert!(is_kernel_thread(engine));
        assert!(!is_kernel_thread(nginx));
        // A name with spaces and a parenthesis: the fields after the last one count.
        assert!(is_kernel_thread("7 (a b) c)) S 2 0 0 0 -1 2097152 0"));
        assert!(!is_kernel_thread("7 (a 2097152) S 2 0 0 0 -1 64 0"));
        assert!(!is_kernel_thread("no parenthesis"));
        assert!(!is_kernel_thread("8 (short) S 2"));
    }

    #[test]
    fn children_lists_parse_and_kernel_threads_are_found_where_proc_shows_them() {
        assert_eq!(parse_pids("3 4 17 \n"), vec![3, 4, 17]);
        assert_eq!(parse_pids(""), Vec::<u32>::new());
        // Where this process sees the host's kthreadd, every pid found is a kernel
        // thread (whichever way they were found) and this process is not among them.
        if is_kernel_pid(KTHREADD) {
            let pids = kernel_pids();
            assert!(!pids.is_empty());
            assert!(!pids.contains(&std::process::id()));
            // A kworker may exit between the listing and the check: only a pid that
            // still exists may fail it.
            let exists = |p: u32| std::path::Path::new(&format!("/proc/{p}")).exists();
            assert!(
                pids.iter().all(|&p| is_kernel_pid(p) || !exists(p)),
                "{pids:?}"
            );
        }
    }

    /// A kept `/proc` file reads what is there now at every read, and a first line
    /// cut short by the buffer is no sample.
    #[test]
    fn a_kept_proc_file_reads_afresh_from_its_start() {
        assert_eq!(
            parse_stat("cpu  1 2 3 4"),
            None,
            "no end of line: cut short"
        );
        let Some(f) = ProcFile::open("/proc/thread-self/schedstat") else {
            return; // a kernel without schedstat: nothing to read
        };
        let mut buf = [0u8; SCHEDSTAT_LEN];
        let before = f.read(&mut buf).and_then(run_ns).expect("schedstat parses");
        // The kernel adds a running thread's time at its ticks and switches: spin
        // (work the optimiser cannot drop) until a read shows more, for at most
        // `PATIENCE`, which only a file read once and kept would exhaust.
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
        let start = std::time::Instant::now();
        let mut after = before;
        while after <= before && start.elapsed() < PATIENCE {
            let busy = (0..200_000u64).fold(0, |a, x| {
                std::hint::black_box(a ^ x.wrapping_mul(2_654_435_761))
            });
            std::hint::black_box(busy);
            after = f.read(&mut buf).and_then(run_ns).expect("schedstat parses");
        }
        assert!(after > before, "{before} -> {after}");
        let stat = ProcFile::open("/proc/stat").expect("/proc/stat opens");
        let mut head = [0u8; STAT_HEAD];
        assert!(stat.read(&mut head).and_then(parse_stat).is_some());
        // A buffer too short for the first line: no sample rather than a wrong one.
        let mut short = [0u8; 12];
        assert_eq!(stat.read(&mut short).and_then(parse_stat), None);
    }

    /// Kept files stay at most MAX_KEPT; past that a thread is read afresh each time.
    #[test]
    fn at_most_max_kept_schedstat_files_stay_open() {
        let me = std::process::id();
        let path = format!("/proc/{me}/schedstat");
        let Some(_) = ProcFile::open(&path) else {
            return;
        };
        let mut files = HashMap::new();
        assert!(read_kept(&mut files, me).is_some());
        assert_eq!(files.len(), 1, "kept");
        assert!(
            read_kept(&mut files, me).is_some(),
            "read from the kept file"
        );
        files.clear();
        for fake in 0..MAX_KEPT as u32 {
            files.insert(u32::MAX - fake, ProcFile::open(&path).expect("opens"));
        }
        assert!(read_kept(&mut files, me).is_some());
        assert_eq!(files.len(), MAX_KEPT);
        assert!(!files.contains_key(&me));
        // A pid that does not exist reads as gone.
        files.clear();
        assert_eq!(read_kept(&mut files, u32::MAX), None);
        assert!(files.is_empty());
    }

    /// A rebuilt list of kernel threads reads the threads it held through the files it
    /// kept (no new open), and lets go of the files of threads no longer listed.
    #[test]
    fn a_rebuilt_thread_list_keeps_the_files_it_holds() {
        use std::io::{Seek, SeekFrom};
        if !is_kernel_pid(KTHREADD) {
            return; // this process does not see the kernel's threads
        }
        let mut files = HashMap::new();
        let first = find_threads(&mut files);
        assert!(!first.is_empty());
        assert!(!files.is_empty() && files.len() <= MAX_KEPT);
        // Mark each open file by its offset (reads are at offset 0 and leave it be): a
        // file opened anew would be back at 0.
        for f in files.values_mut() {
            f.0.seek(SeekFrom::Start(1)).expect("a /proc file seeks");
        }
        let held: Vec<u32> = files.keys().copied().collect();
        let me = format!("/proc/{}/schedstat", std::process::id());
        files.insert(u32::MAX, ProcFile::open(&me).expect("own schedstat opens"));
        let second = find_threads(&mut files);
        assert!(!second.is_empty());
        assert!(
            !files.contains_key(&u32::MAX),
            "a pid no longer listed lets go"
        );
        let mut alive = 0;
        for pid in held {
            if let Some(f) = files.get_mut(&pid) {
                alive += 1;
                assert_eq!(
                    f.0.stream_position().expect("offset"),
                    1,
                    "pid {pid} reopened"
                );
            }
        }
        assert!(alive > 0);
    }

    #[test]
    fn the_run_time_and_delay_are_schedstat_s_first_fields() {
        assert_eq!(run_ns("1017830000 2250000 311\n"), Some(1_017_830_000));
        assert_eq!(run_ns(""), None);
        assert_eq!(run_ns("x 1 2"), None);
        assert_eq!(run_delay("1017830000 2250000 311\n"), Some(2_250_000));
        assert_eq!(run_delay("1017830000"), None);
        assert_eq!(run_delay("1 x 2"), None);
    }

    /// The soft guest's module-only run at 1 KiB: 1.02 s on `virtio0-engine` against
    /// 0.77 s of nginx's CPU in 1720 module calls over 5 s, with 22 ms/s of usual
    /// kernel-thread work (RCU) taken off first.
    #[test]
    fn the_share_is_the_kernel_threads_time_beyond_their_usual_per_caller_ns() {
        let wall = 5_000_000_000;
        let usual = 22_000_000 * KERNEL_SHARE_UNIT as u64 / 1_000_000_000;
        assert_eq!(usual, 22);
        let kernel = 1_020_000_000 + 110_000_000;
        let share = |k, w, b, c| excess_of(k, w, b, c).map(|e| share_of_sums(e, c));
        assert_eq!(share(kernel, wall, usual, 770_000_000), Some(1324));
        // Without a baseline every kernel-thread ns counts.
        assert_eq!(share(kernel, wall, 0, 770_000_000), Some(1467));
        // Less than usual: a negative excess (a share of 0 alone); no module call: no
        // window.
        assert_eq!(excess_of(1_000, wall, usual, 1_000), Some(-1_000 * 64));
        assert_eq!(share(1_000, wall, usual, 1_000), Some(0));
        assert_eq!(excess_of(kernel, wall, usual, 0), None);
        // At most MAX_KERNEL_SHARE times the callers' time, either way.
        assert_eq!(excess_of(kernel, wall, 0, 1_000), Some(64_000));
    }

    /// The `balanced` nginx at 1 KiB (twenty-seventh session) calls the module only to
    /// check it: a few windows hold a burst of calls, the rest none or one. Kernel
    /// threads that vary by a few ms a window around their usual rate then moved an
    /// average of clipped per-window ratios to 1.3-2.1 ns per ns, where the windows
    /// full of calls (the `module` nginx) read 0.6. Summed, the few-call windows weigh
    /// by their calls and their noise cancels.
    #[test]
    fn windows_with_few_module_calls_do_not_raise_the_share() {
        let half = Duration::from_millis(500);
        let mut st = KernelState {
            baseline: Some(20),
            ..KernelState::default()
        };
        // 10 ms of usual kernel work a window.
        let usual = 10_000_000;
        for i in 0..40u64 {
            // One window in four: a burst of 8 calls, 3.2 ms of the caller's CPU and
            // 0.6 ns per ns on the kernel's threads; the others one call (0.4 ms, at
            // the same 0.6) beside the usual work, give or take 1 ms. Averaged window
            // by window and clipped at zero, these read ~1.1 ns per ns.
            let (caller, kernel) = match i % 4 {
                0 => (3_200_000, usual + 1_920_000),
                1 => (400_000, usual + 240_000 + 1_000_000),
                2 => (400_000, usual + 240_000),
                _ => (400_000, usual + 240_000 - 1_000_000),
            };
            let share = st.close_window(half, caller, kernel);
            if i >= 8 {
                let share = share.unwrap_or(0);
                assert!((300..=900).contains(&share), "window {i}: share {share}");
            }
        }
    }

    /// A dropped total gives its page back: more totals than a process may hold
    /// mappings (`vm.max_map_count`, 65,530 by default) are made and dropped one after
    /// another, and each is still shared. (Where the limit is set above 2^18, the test
    /// stops there, a few seconds, and proves less.)
    #[test]
    fn a_dropped_total_unmaps_its_page() {
        let limit: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(65_530);
        for i in 0..limit.min(1 << 18) + 100 {
            let total = SharedTotal::new();
            assert!(total.is_shared(), "total {i} not mapped");
        }
    }

    /// nginx's workers are forked from the master that loaded the provider: a module
    /// call's CPU time added in a child shows in the parent's total (and so in every
    /// worker's kernel share), where a count of each process's own would not.
    #[test]
    fn the_callers_module_cpu_is_one_total_across_forked_workers() {
        let total = SharedTotal::new();
        assert!(total.is_shared(), "an anonymous shared page maps on Linux");
        total.add(40_000_000);
        // SAFETY: fork; the child only adds to the atomic and _exits (both
        // async-signal-safe, so the test harness's other threads do not matter).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            total.add(40_000_000);
            // SAFETY: ends the child at once, no unwinding or atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert_eq!(status, 0);
        assert_eq!(total.get(), 80_000_000, "the child's calls count here");
        // Two workers, 40 ms of module calls each in a window and 80 ms on the
        // kernel's threads for both: the share is 1 ns per ns; against one worker's
        // calls alone it came out twice that.
        let half = Duration::from_millis(500);
        let mut st = KernelState::default();
        assert_eq!(st.close_window(half, total.get(), 80_000_000), Some(1000));
        let mut own = KernelState::default();
        assert_eq!(own.close_window(half, 40_000_000, 80_000_000), Some(2000));
        // Where no page can be mapped, the process's own count still works.
        let own = SharedTotal(Total::Own(AtomicU64::new(0)));
        own.add(7);
        assert!(!own.is_shared());
        assert_eq!(own.get(), 7);
    }

    #[test]
    fn the_kernel_averages_move_a_quarter_of_the_way() {
        assert_eq!(average(None, 1000), 1000);
        assert_eq!(average(Some(1000), 2000), 1250);
        assert_eq!(average(Some(1000), 0), 750);
    }

    /// Nothing is read before the first module call; the first read after it only
    /// lists the kernel threads (a window starts), and reads come at most once per
    /// KERNEL_PERIOD.
    #[test]
    fn the_kernel_threads_are_read_only_once_modules_ran_and_once_a_period() {
        let k = KernelSampler::default();
        let t0 = Instant::now();
        assert_eq!(k.sample(t0, 0), None);
        assert!(k.state.lock().unwrap().last.is_none(), "no module call yet");
        assert_eq!(k.sample(t0, 1_000), None, "the first read starts a window");
        assert_eq!(k.state.lock().unwrap().last, Some((t0, 1_000)));
        assert_eq!(k.sample(t0 + KERNEL_PERIOD / 2, 2_000), None);
        assert_eq!(k.state.lock().unwrap().last, Some((t0, 1_000)));
        // A period later a window closes: a share where module calls ran in it
        // (whatever the kernel threads did in real time: only its presence is sure
        // where /proc can be read).
        let later = t0 + KERNEL_PERIOD + Duration::from_millis(1);
        let share = k.sample(later, 3_000);
        assert_eq!(k.state.lock().unwrap().last, Some((later, 3_000)));
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(share.is_some());
        }
        // A window without module calls feeds the baseline instead.
        let next = later + KERNEL_PERIOD;
        assert_eq!(k.sample(next, 3_000), None);
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(k.state.lock().unwrap().baseline.is_some());
        }
    }

    /// Issue 22's miss (CBC, 1 MiB responses, a connection per request, the three nginx
    /// instances run in turn): the `balanced` nginx sat idle for 9 s while the others
    /// ran, and its first window after that held 2.5 s of `virtio0-engine` (the
    /// `module` instance's calls) against its own first 16 KiB module call's 0.2 ms of
    /// CPU. Folded in, that window made the module look dear for seconds and the
    /// records went in-line; a window that long now only starts a fresh one.
    #[test]
    fn an_idle_spell_does_not_make_the_module_look_dear() {
        use hetcrypt::policy::call::{CallRouter, CallSite, Route, RouterMode};
        let record = CallSite {
            cipher: 0,
            encrypt: true,
            len: 16_432,
        };
        // The soft guest's 16 KiB records: 1.9 ms in-line; 0.45 ms on the module, 0.2
        // ms of it nginx's CPU; every CPU busy.
        let router = || {
            let r = CallRouter::new(RouterMode::Balanced, 1, None);
            for _ in 0..8 {
                r.observe_cpu(record, 1_900_000);
            }
            r.observe_module(record, 450_000);
            r.observe_module_cpu(record, 200_000);
            r.set_busy(FULL_LOAD);
            r
        };
        let on_module = |r: &CallRouter| {
            (0..1024)
                .filter(|_| !matches!(r.route(record), Route::Cpu { .. }))
                .count()
        };
        let half = Duration::from_millis(500);
        // Its own run: 0.5-s windows, 40 ms of nginx's CPU in module calls and as
        // much on the kernel's threads.
        let mut st = KernelState::default();
        let mut share = None;
        for _ in 0..8 {
            share = st.close_window(half, 40_000_000, 40_000_000).or(share);
        }
        assert_eq!(share, Some(1000));
        let r = router();
        r.set_kernel_share(1000);
        assert!(on_module(&r) >= 900, "the records go to the module");
        // The idle spell's reads, had they been a window: 2.5 s of kernel work against
        // 0.2 ms of calls, counted at most 64 ns per ns of them, among windows of
        // 40 ms of calls each: the module looks dearer, but the window weighs by its
        // few calls.
        let mut folded = KernelState {
            share: st.share,
            sums: st.sums,
            ..KernelState::default()
        };
        let dear = folded.close_window(half, 200_000, 2_500_000_000);
        assert!(dear.is_some_and(|d| d > 1000 && d < 1200), "{dear:?}");
        // The fix: a 9-s window is no window; the share stays, and so do the records.
        let wall = Duration::from_secs(9);
        assert_eq!(st.close_window(wall, 200_000, 2_500_000_000), None);
        assert_eq!(st.share, Some(1000));
        assert_eq!(
            st.close_window(wall, 0, 2_500_000_000),
            None,
            "nor a baseline"
        );
        assert_eq!(st.baseline, None);
        assert_eq!(st.close_window(half, 40_000_000, 40_000_000), Some(1000));
        let r = router();
        r.set_kernel_share(1000);
        assert!(on_module(&r) >= 900);
        // Up to STALE_AFTER a window counts.
        assert!(st.close_window(STALE_AFTER, 0, 0).is_none());
        assert_eq!(st.baseline, Some(0));
    }

    /// Threads that run while the module does stay watched; one that stays still
    /// through DROP_AFTER windows with module calls goes, and windows without module
    /// calls do not count against it; a thread that is gone goes at once.
    #[test]
    fn only_threads_that_run_while_the_module_does_stay_watched() {
        let w = |pid, ns| Watched { pid, ns, idle: 0 };
        let mut threads = vec![w(1, 100), w(2, 500), w(3, 7)];
        // Thread 1 runs 50 ns a window, thread 2 never, thread 3 is gone.
        let mut clock = 100;
        let mut window = |threads: &mut Vec<Watched>, module_ran| {
            clock += 50;
            let now = clock;
            advance(threads, module_ran, |pid| match pid {
                1 => Some(now),
                2 => Some(500),
                _ => None,
            })
        };
        assert_eq!(window(&mut threads, true), 50);
        assert_eq!(
            threads,
            [
                w(1, 150),
                Watched {
                    pid: 2,
                    ns: 500,
                    idle: 1
                }
            ]
        );
        // Windows without module calls: thread 2 is not held against.
        for _ in 0..10 {
            assert_eq!(window(&mut threads, false), 50);
        }
        assert_eq!(threads.len(), 2);
        for _ in 1..DROP_AFTER {
            window(&mut threads, true);
        }
        assert_eq!(threads.iter().map(|t| t.pid).collect::<Vec<_>>(), [1]);
        // A thread that runs again starts its count afresh.
        let mut t = vec![Watched {
            pid: 9,
            ns: 0,
            idle: DROP_AFTER - 1,
        }];
        assert_eq!(advance(&mut t, true, |_| Some(3)), 3);
        assert_eq!(
            t,
            [Watched {
                pid: 9,
                ns: 3,
                idle: 0
            }]
        );
    }
}
