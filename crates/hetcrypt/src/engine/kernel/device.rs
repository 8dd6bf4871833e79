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
//! So the engine (1) looks, before every request, whether the device is still bound to
//! its driver: the kernel removes the device's `driver` link in sysfs before it calls
//! the driver's remove function (`driver_sysfs_remove` comes before `device_remove` in
//! `__device_release_driver`), so a vanished link means "stop now". Whatever removes
//! the device (a hot-unplug of its PCI parent, or an unbind of the crypto driver alone),
//! the crypto driver's own device (`virtio0`) loses its link before that driver's remove
//! function runs, so that link is the one looked at per request; the parents' links
//! (`0000:00:02.0`) are looked at too before keying. The look is a `faccessat2` of
//! `driver` relative to a descriptor of the device's sysfs directory held open: one
//! path component, not the six of the full path (an `lstat` of that cost 21-34 µs in
//! the TCG guest, against 7.6 µs, on requests of 70-150 µs). No signal that costs the
//! request path no system call comes as early: everything the 6.1 kernel tells user
//! space about the removal (the `unbind` and `remove` uevents, the unmapping of an
//! mmapped PCI resource file) comes after the driver's remove function has run, and
//! removing a sysfs link raises no inotify event and no `POLLPRI`; a thread watching
//! for those would flag the device only once a request on it can already oops the
//! kernel (docs/performance.md, "One request in flight again"); and (2) once
//! the engine has failed, hands its sockets to a child process that keeps them open and
//! sleeps, so this process can still exit.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{open, AtFlags, OFlag};
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
    links: Arc<Vec<Watched>>,
}

/// The name of a device's link to its driver in its sysfs directory.
const DRIVER_LINK: &str = "driver";

/// One watched link: its device directory, held open, and the path (for messages).
#[derive(Debug)]
struct Watched {
    dir: OwnedFd,
    link: PathBuf,
    /// Whether this is a device bound to the module's own driver (looked at before
    /// every request), not one of its parents (looked at before keying).
    own: bool,
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
                            links.push(Watched { dir: fd, link, own });
                        }
                    }
                    own = false;
                    cur = dir.parent();
                }
            }
        }
        DeviceWatch {
            links: Arc::new(links),
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
    /// one is going, why (in words), so that the caller issues no request.
    pub(crate) fn gone(&self) -> Option<String> {
        self.first_gone(true)
    }

    /// Before keying: as [`DeviceWatch::gone`], the parents' links included.
    pub(crate) fn gone_all(&self) -> Option<String> {
        self.first_gone(false)
    }

    /// The first watched link (only the driver's own devices' if `own_only`) that has
    /// vanished, in words.
    fn first_gone(&self, own_only: bool) -> Option<String> {
        self.links
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

    /// A device directory with a `driver` link, as sysfs has it, under a fresh
    /// temporary directory; returns the watched entry.
    fn watched(root: &Path, name: &str, own: bool) -> Watched {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::os::unix::fs::symlink("../drivers/x", dir.join(DRIVER_LINK)).expect("symlink");
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        Watched {
            dir: open(&dir, flags, Mode::empty()).expect("open dir"),
            link: dir.join(DRIVER_LINK),
            own,
        }
    }

    #[test]
    fn requests_look_at_the_drivers_own_device_and_keying_at_its_parents_too() {
        let root = std::env::temp_dir().join(format!("hetcrypt-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let watch = DeviceWatch {
            links: Arc::new(vec![
                watched(&root, "pci/virtio0", true),
                watched(&root, "pci", false),
            ]),
        };
        assert_eq!((watch.gone(), watch.gone_all()), (None, None));
        // The parent unbound first (a PCI hot-unplug): keying stops, requests go on
        // until the driver's own device goes too.
        std::fs::remove_file(root.join("pci/driver")).expect("unlink");
        assert_eq!(watch.gone(), None);
        let why = watch.gone_all().expect("the parent's link is gone");
        assert!(why.contains("pci/driver vanished"), "{why}");
        std::fs::remove_file(root.join("pci/virtio0/driver")).expect("unlink");
        let why = watch.gone().expect("the device's own link is gone");
        assert!(why.contains("virtio0/driver vanished"), "{why}");
        assert!(watch.check().is_err() && watch.check_all().is_err());
        // Nothing watched (no offload device): never gone.
        assert_eq!(DeviceWatch::default().gone_all(), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
