//! Living with a crypto device that can vanish: notice it going, and never close its sockets.
//!
//! What the Debian 6.1 guest kernel does when the virtio-crypto device is hot-unplugged
//! while AF_ALG transforms use it (seen in the testbed): the driver frees the device
//! and its request engine though transforms still point at them. A request issued
//! afterwards is a use-after-free (general protection fault, the thread dies holding a
//! spinlock); closing a keyed transform sends a "close session" request to the freed
//! device and sleeps uninterruptibly forever, at process exit too. Only a request that
//! is in flight while the device stops comes back cleanly, with `ESHUTDOWN`.
//!
//! So the engine (1) looks, before every request, whether the device is still there and
//! bound to its driver, and issues no request once it is going. Two looks, because no
//! one signal is both early for every way a device goes and cheap per request:
//! - **Per request, the device's own `uevent` attribute, held open**: a `poll` of it
//!   with no timeout, 0.12-0.13 of a sysfs path look in the TCG guest (2.6 against
//!   19.7 µs; docs/performance.md, "A cheaper unplug look"). `device_del` removes a
//!   device's `uevent` file (kernfs deactivates it: `poll` answers `POLLERR`) before
//!   `bus_remove_device` releases its driver, so it turns before the driver's remove
//!   function runs whatever removes the device: a hot-unplug of its PCI parent, an
//!   unbind of the parent's driver (`virtio_pci`), a `device_del` in QEMU.
//! - **At keying, and at least every [`LINK_LOOK_INTERVAL`] of requests, the device's
//!   `driver` link**: the kernel removes it before it calls the driver's remove
//!   function (`driver_sysfs_remove` comes before `device_remove` in
//!   `__device_release_driver`), and it is the only sign of an unbind of the crypto
//!   driver alone (`echo virtio0 > .../virtio_crypto/unbind`), which leaves the device
//!   and its attributes in place. Such an unbind while requests flow can thus oops the
//!   kernel within that interval, as it can for the kernel's own users of the driver
//!   (it frees the device under their transforms too); a removal of the device is
//!   seen before every request, as before. The look is a `faccessat2` of `driver`
//!   relative to a descriptor of the device's sysfs directory held open (one path
//!   component, not the six of the full path); the parents' links (`0000:00:02.0`)
//!   are looked at too before keying. Where no `uevent` can be held open, the link is
//!   looked at before every request, as before.
//!
//! No signal that costs the request path no system call comes as early: everything
//! the 6.1 kernel tells user space about the removal (the `unbind` and `remove`
//! uevents, the unmapping of an mmapped PCI resource file) comes after the driver's
//! remove function has run, and removing a sysfs node wakes no poller and raises no
//! inotify event; a thread watching for those would flag the device only once a
//! request on it can already oops the kernel (docs/performance.md, "One request in
//! flight again"); and (2) once the engine has failed, hands its sockets to a child
//! process that keeps them open and sleeps, so this process can still exit.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{open, AtFlags, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::stat::Mode;
use nix::unistd::{faccessat, AccessFlags};

use super::Failure;

/// Where sysfs lists, per module, the drivers it registers.
const SYS_MODULE: &str = "/sys/module";
/// Where sysfs keeps the device tree (`driver` links live under it).
const SYS_DEVICES: &str = "/sys/devices";

/// The sysfs `driver` links of the devices serving an offload driver (the device and
/// its parents, e.g. `.../0000:00:02.0/virtio0/driver` and `.../0000:00:02.0/driver`).
/// All must exist while the device can take requests.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeviceWatch {
    inner: Arc<Watches>,
}

/// What a [`DeviceWatch`] shares between the lanes of an engine.
#[derive(Debug, Default)]
struct Watches {
    links: Vec<Watched>,
    /// When the own devices' links were last seen in place, in nanoseconds since
    /// `epoch` (0: not yet), so that the lanes together look at them once per
    /// [`LINK_LOOK_INTERVAL`].
    last_link_look: AtomicU64,
    epoch: Option<Instant>,
}

/// The name of a device's link to its driver in its sysfs directory.
const DRIVER_LINK: &str = "driver";
/// The attribute file every device has, held open to be polled per request.
const UEVENT: &str = "uevent";

/// How long requests may go on between two looks at the own devices' `driver` links,
/// where their `uevent` is held open. That look (12.5-27.7 µs in the TCG guest, and
/// 20-30% of a request's time there) is what catches an unbind of the crypto driver
/// alone; 5 ms makes it under 1% of the request path, and bounds the time such an
/// unbind goes unseen while requests flow.
pub(crate) const LINK_LOOK_INTERVAL: Duration = Duration::from_millis(5);

/// One watched device: its directory, held open, its `driver` link's path (for
/// messages) and, for the driver's own devices, its `uevent` attribute held open.
#[derive(Debug)]
struct Watched {
    dir: OwnedFd,
    link: PathBuf,
    /// Whether this is a device bound to the module's own driver (looked at before
    /// every request), not one of its parents (looked at before keying).
    own: bool,
    /// The device's `uevent` attribute, open for reading (own devices only; `None` if
    /// it could not be opened, and then the link is looked at per request).
    uevent: Option<File>,
}

impl DeviceWatch {
    /// Watches every device bound to a driver of kernel module `module` (for
    /// `virtio_crypto`: `/sys/module/virtio_crypto/drivers/virtio:virtio_crypto/virtio0`).
    /// Empty if sysfs shows none (then nothing is checked).
    pub(crate) fn for_module(module: &str) -> Self {
        let mut links = Vec::new();
        let drivers = Path::new(SYS_MODULE).join(module).join("drivers");
        for driver in std::fs::read_dir(drivers).into_iter().flatten().flatten() {
            for entry in std::fs::read_dir(driver.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                // Bound devices are symlinks; so is `module`, which is not a device.
                let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
                if !is_link || entry.file_name() == "module" {
                    continue;
                }
                let Ok(device) = std::fs::canonicalize(entry.path()) else {
                    continue;
                };
                let mut cur = Some(device.as_path());
                let mut own = true;
                while let Some(dir) = cur.filter(|d| d.starts_with(SYS_DEVICES)) {
                    let link = dir.join(DRIVER_LINK);
                    let known = links.iter().any(|w: &Watched| w.link == link);
                    if !known && std::fs::symlink_metadata(&link).is_ok() {
                        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
                        if let Ok(fd) = open(dir, flags, Mode::empty()) {
                            let uevent = own.then(|| File::open(dir.join(UEVENT)).ok()).flatten();
                            links.push(Watched {
                                dir: fd,
                                link,
                                own,
                                uevent,
                            });
                        }
                    }
                    own = false;
                    cur = dir.parent();
                }
            }
        }
        DeviceWatch::of(links)
    }

    /// A watch over `links`, their `driver` links not yet looked at.
    fn of(links: Vec<Watched>) -> Self {
        DeviceWatch {
            inner: Arc::new(Watches {
                links,
                last_link_look: AtomicU64::new(0),
                epoch: Some(Instant::now()),
            }),
        }
    }

    /// Before a request: `Ok` while the driver's own devices are still bound; the
    /// engine's failure (and no request) once one is going.
    pub(super) fn check(&self) -> Result<(), Failure> {
        match self.gone() {
            None => Ok(()),
            Some(why) => Err(Failure::Engine(why)),
        }
    }

    /// Before keying: as [`DeviceWatch::check`], the parents' links included.
    pub(super) fn check_all(&self) -> Result<(), Failure> {
        match self.gone_all() {
            None => Ok(()),
            Some(why) => Err(Failure::Engine(why)),
        }
    }

    /// Before a request: `None` while every device bound to the driver still is; once
    /// one is going, why (in words), so that the caller issues no request. Polls the
    /// own devices' `uevent` files, and looks at their `driver` links where none is
    /// held open or [`LINK_LOOK_INTERVAL`] has passed since the last look.
    pub(crate) fn gone(&self) -> Option<String> {
        self.gone_at(Instant::now())
    }

    /// [`DeviceWatch::gone`] at time `now`.
    fn gone_at(&self, now: Instant) -> Option<String> {
        let own = || self.inner.links.iter().filter(|w| w.own);
        if let Some(w) = own().find(|w| w.uevent.as_ref().is_some_and(removed)) {
            return Some(format!(
                "device going away ({} removed), no request issued",
                w.link.with_file_name(UEVENT).display()
            ));
        }
        let since = |epoch: Instant| {
            u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
        };
        let at = self.inner.epoch.map_or(0, since);
        let last = self.inner.last_link_look.load(Ordering::Relaxed);
        let interval = u64::try_from(LINK_LOOK_INTERVAL.as_nanos()).unwrap_or(u64::MAX);
        let due =
            own().any(|w| w.uevent.is_none()) || last == 0 || at.saturating_sub(last) >= interval;
        if !due {
            return None;
        }
        let why = self.first_gone(true);
        if why.is_none() {
            self.inner
                .last_link_look
                .store(at.max(1), Ordering::Relaxed);
        }
        why
    }

    /// Before keying: as [`DeviceWatch::gone`], the parents' links included.
    pub(crate) fn gone_all(&self) -> Option<String> {
        self.first_gone(false)
    }

    /// The first watched link (only the driver's own devices' if `own_only`) that has
    /// vanished, in words.
    fn first_gone(&self, own_only: bool) -> Option<String> {
        self.inner
            .links
            .iter()
            .filter(|w| w.own || !own_only)
            .find(|w| !link_exists(&w.dir))
            .map(|gone| {
                format!(
                    "device going away ({} vanished), no request issued",
                    gone.link.display()
                )
            })
    }
}

/// Whether `dir` (a device's sysfs directory) still holds its `driver` link: one
/// `faccessat2(dir, "driver", F_OK, AT_EACCESS | AT_SYMLINK_NOFOLLOW)`, the cheapest
/// look found: the same one-component lookup as `fstatat`, without filling and copying
/// out a `struct stat`, and (`AT_EACCESS`) without switching credentials. Per call, in
/// alternating rounds: 0.84-0.86x an `fstatat` of the same link (host, Linux 6.18,
/// and the TCG guest, Linux 6.1; docs/performance.md, "Nineteenth session"). Any
/// failure (`ENOENT` once the link is gone) counts as gone.
fn link_exists(dir: &OwnedFd) -> bool {
    faccessat(
        dir,
        DRIVER_LINK,
        AccessFlags::F_OK,
        AtFlags::AT_EACCESS | AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .is_ok()
}

/// Whether a held-open sysfs attribute has been removed: a `poll` with no timeout
/// answers `POLLERR | POLLPRI` once kernfs has deactivated the file (and also after a
/// `sysfs_notify` of it since it was last read, which `uevent` never gets); a read then
/// tells the two apart (`ENODEV` once removed) and takes the notice of a mere change.
fn removed(attr: &File) -> bool {
    let mut fds = [PollFd::new(attr.as_fd(), PollFlags::POLLPRI)];
    let flagged = match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_none_or(|r| {
            r.intersects(PollFlags::POLLERR | PollFlags::POLLPRI | PollFlags::POLLNVAL)
        }),
        Err(_) => true,
    };
    /// Enough for a `uevent` file's text; only whether the read succeeds matters.
    const READ_BYTES: usize = 512;
    flagged && attr.read_at(&mut [0; READ_BYTES], 0).is_err()
}

/// Keeps `fds` open for good in a child process that does nothing but sleep, so that
/// they are never closed (closing a transform of a vanished virtio-crypto device hangs
/// the closing thread forever). Our copies are then closed: the sockets live on in the
/// child. If no child can be made, our copies are leaked instead.
pub(crate) fn park(fds: Vec<OwnedFd>) {
    if fds.is_empty() {
        return;
    }
    let mut keep: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    keep.sort_unstable();
    // SAFETY: fork in a threaded process is sound if the child makes only
    // async-signal-safe calls until it execs or exits; this child makes only raw
    // system calls (close_range/close, pause) and never returns to other code.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            close_all_but(&keep);
            loop {
                // SAFETY: pause only sleeps until a signal arrives.
                unsafe { nix::libc::pause() };
            }
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => drop(fds),
        Err(_) => std::mem::forget(fds),
    }
}

/// Closes every descriptor but those in `keep` (sorted). Runs in the forked child:
/// raw system calls only.
fn close_all_but(keep: &[RawFd]) {
    /// Highest descriptor tried when `close_range` (Linux 5.9) is missing.
    const FALLBACK_MAX_FD: RawFd = 1 << 16;
    let close_range = |first: RawFd, last: RawFd| {
        if first > last {
            return;
        }
        // SAFETY: close_range only closes descriptors of this (child) process.
        let r = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_close_range,
                first as nix::libc::c_uint,
                last as nix::libc::c_uint,
                0 as nix::libc::c_uint,
            )
        };
        if r != 0 {
            for fd in first..=last.min(FALLBACK_MAX_FD) {
                // SAFETY: closing a descriptor number of this process; errors ignored.
                unsafe { nix::libc::close(fd) };
            }
        }
    };
    let mut next: RawFd = 0;
    for &fd in keep {
        close_range(next, fd - 1);
        next = fd + 1;
    }
    close_range(next, RawFd::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device directory with a `driver` link and (if `uevent`) a `uevent` file, as
    /// sysfs has them, under a fresh temporary directory; returns the watched entry.
    fn watched(root: &Path, name: &str, own: bool, uevent: bool) -> Watched {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::os::unix::fs::symlink("../drivers/x", dir.join(DRIVER_LINK)).expect("symlink");
        let uevent = uevent.then(|| {
            std::fs::write(dir.join(UEVENT), "DRIVER=x\n").expect("uevent");
            File::open(dir.join(UEVENT)).expect("open uevent")
        });
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        Watched {
            dir: open(&dir, flags, Mode::empty()).expect("open dir"),
            link: dir.join(DRIVER_LINK),
            own,
            uevent,
        }
    }

    fn temp_root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("hetcrypt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        root
    }

    #[test]
    fn requests_look_at_the_drivers_own_device_and_keying_at_its_parents_too() {
        let root = temp_root("watch");
        let watch = DeviceWatch::of(vec![
            watched(&root, "pci/virtio0", true, true),
            watched(&root, "pci", false, false),
        ]);
        let look = Instant::now();
        assert_eq!((watch.gone_at(look), watch.gone_all()), (None, None));
        // The parent unbound first (a PCI hot-unplug): keying stops, requests go on
        // until the driver's own device goes too.
        std::fs::remove_file(root.join("pci/driver")).expect("unlink");
        assert_eq!(watch.gone_at(look), None);
        let why = watch.gone_all().expect("the parent's link is gone");
        assert!(why.contains("pci/driver vanished"), "{why}");
        std::fs::remove_file(root.join("pci/virtio0/driver")).expect("unlink");
        assert!(watch.check_all().is_err());
        // With its `uevent` held open (and, here, never removed: an unbind of the driver
        // alone), the own link is looked at once per interval, not per request.
        assert_eq!(watch.gone_at(look), None, "looked at at `look`");
        let why = watch
            .gone_at(look + LINK_LOOK_INTERVAL)
            .expect("the device's own link is gone, and the interval has passed");
        assert!(why.contains("virtio0/driver vanished"), "{why}");
        // Nothing watched (no offload device): never gone.
        assert_eq!(DeviceWatch::default().gone_all(), None);
        assert_eq!(DeviceWatch::default().gone(), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_new_watch_looks_at_the_link_on_its_first_request() {
        let root = temp_root("watch-first");
        let watch = DeviceWatch::of(vec![watched(&root, "virtio0", true, true)]);
        std::fs::remove_file(root.join("virtio0/driver")).expect("unlink");
        // At the watch's very start, no interval has passed, yet nothing was seen.
        let start = watch.inner.epoch.expect("a watch of links has a start");
        let why = watch.gone_at(start).expect("the first request looks");
        assert!(why.contains("virtio0/driver vanished"), "{why}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn without_a_held_uevent_the_own_link_is_looked_at_before_every_request() {
        let root = temp_root("watch-link");
        let watch = DeviceWatch::of(vec![watched(&root, "virtio0", true, false)]);
        let now = Instant::now();
        assert_eq!(watch.gone_at(now), None);
        std::fs::remove_file(root.join("virtio0/driver")).expect("unlink");
        let why = watch.gone_at(now).expect("looked at per request");
        assert!(why.contains("virtio0/driver vanished"), "{why}");
        assert!(watch.check().is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_live_attribute_is_not_taken_for_a_removed_one() {
        // A sysfs attribute that stays (the host's first CPU, where sysfs is mounted)
        // and a plain file: `poll` flags neither, so no request is refused.
        for path in ["/sys/devices/system/cpu/cpu0/uevent", "/proc/self/stat"] {
            if let Ok(f) = File::open(path) {
                assert!(!removed(&f), "{path}");
            }
        }
    }
}
