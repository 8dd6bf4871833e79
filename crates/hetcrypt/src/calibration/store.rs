//! The calibration store: one versioned JSON file at a standard place, keyed by a
//! fingerprint of the machine, read without ever failing and written atomically.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Calibration;
use crate::engine::kernel::proc_crypto;
use crate::error::{Error, Result};

/// The store's format version. Bump it when a field changes meaning; a file of another
/// version is stale (remeasured, never misread). 2: offload engines' lanes sweeps go to
/// 4 whatever the engine's own count, and the cpu engine's GCM costs may be `ring`'s
/// (fifteenth session); a format-1 store holds one-lane sweeps and EVP's GCM.
pub const FORMAT_VERSION: u32 = 2;

/// Environment variable naming the store file, over the default place.
pub const ENV_PATH: &str = "HETCRYPT_CALIBRATION";

/// The system-wide store, written by root and read by every user who has none of
/// their own (a daemon's OpenSSL provider, for one).
pub const SYSTEM_PATH: &str = "/var/lib/hetcrypt/calibration.json";

/// The file name under a user's state directory (`$XDG_STATE_HOME/hetcrypt/`).
const USER_FILE: &str = "hetcrypt/calibration.json";

/// The kernel algorithms whose drivers the fingerprint lists: what the `kernel`
/// engines bind for AES, and the block cipher the kernel's templates build them from
/// where no driver implements a mode whole.
const KERNEL_ALGORITHMS: [&str; 4] = ["aes", "cbc(aes)", "ctr(aes)", "gcm(aes)"];

/// What a calibration depends on. Any difference makes a stored one stale: another
/// CPU or CPU flags (AES-NI masked, a different VM model), another kernel, a driver
/// loaded, unloaded or re-prioritised, another OpenSSL or hetcrypt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fingerprint {
    /// The hetcrypt library's version.
    pub hetcrypt: String,
    /// `model name` of the first CPU in `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Its `flags` line (which AES instructions there are).
    pub cpu_flags: String,
    /// `OPENSSL_ia32cap`, which masks CPU features from OpenSSL, where set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openssl_ia32cap: Option<String>,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// OpenSSL's version string.
    pub openssl: String,
    /// The kernel's AES drivers with their priorities, sorted.
    pub drivers: Vec<DriverId>,
}

/// One kernel driver as the fingerprint lists it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DriverId {
    /// The algorithm, e.g. `cbc(aes)`.
    pub algorithm: String,
    /// The driver, e.g. `virtio_crypto_aes_cbc`.
    pub driver: String,
    /// Its priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
}

impl Fingerprint {
    /// This machine's fingerprint now (reads `/proc/cpuinfo` and `/proc/crypto`; a file
    /// that cannot be read gives empty fields).
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == name)
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        let drivers =
            drivers(proc_crypto::read(Path::new(proc_crypto::PROC_CRYPTO)).unwrap_or_default());
        Fingerprint {
            hetcrypt: env!("CARGO_PKG_VERSION").to_string(),
            cpu_model: field("model name"),
            // ARM kernels call the flags `Features`.
            cpu_flags: match field("flags") {
                f if f.is_empty() => field("Features"),
                f => f,
            },
            openssl_ia32cap: std::env::var("OPENSSL_ia32cap").ok(),
            kernel: crate::engine::kernel::kernel_release(),
            openssl: openssl::version::version().to_string(),
            drivers,
        }
    }

    /// Why a calibration measured under `self` does not hold on a machine of `now`,
    /// in words; `None` when it holds.
    pub fn mismatch(&self, now: &Fingerprint) -> Option<String> {
        if self.cpu_model != now.cpu_model {
            return Some(format!(
                "it was measured on another CPU ('{}'; this one is '{}')",
                self.cpu_model, now.cpu_model
            ));
        }
        if self.cpu_flags != now.cpu_flags {
            return Some("the CPU's feature flags have changed since it was measured".into());
        }
        if self.openssl_ia32cap != now.openssl_ia32cap {
            return Some(format!(
                "OPENSSL_ia32cap was {} when it was measured and is {} now",
                self.openssl_ia32cap.as_deref().unwrap_or("unset"),
                now.openssl_ia32cap.as_deref().unwrap_or("unset")
            ));
        }
        if self.kernel != now.kernel {
            return Some(format!(
                "it was measured under Linux {}; this is Linux {}",
                self.kernel, now.kernel
            ));
        }
        if self.drivers != now.drivers {
            let show = |d: &[DriverId], o: &[DriverId]| {
                d.iter()
                    .filter(|x| !o.contains(x))
                    .map(|x| match x.priority {
                        Some(p) => format!("{} (priority {p})", x.driver),
                        None => x.driver.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (gone, new) = (
                show(&self.drivers, &now.drivers),
                show(&now.drivers, &self.drivers),
            );
            return Some(format!(
                "the kernel's AES drivers have changed (gone: {}; new: {})",
                if gone.is_empty() { "none" } else { &gone },
                if new.is_empty() { "none" } else { &new }
            ));
        }
        if self.openssl != now.openssl {
            return Some(format!(
                "it was measured with {}; this is {}",
                self.openssl, now.openssl
            ));
        }
        if self.hetcrypt != now.hetcrypt {
            return Some(format!(
                "it was measured by hetcrypt {}; this is hetcrypt {}",
                self.hetcrypt, now.hetcrypt
            ));
        }
        None
    }
}

/// The AES drivers of a `/proc/crypto` listing that the fingerprint keeps, sorted:
/// those a module or the kernel registered, not the template instances (`ctr(aes-
/// generic)`, `gcm_base(...)`) the kernel makes on first use, which would make a store
/// stale after every reboot until some program asked for the mode again. A template
/// instance is built from the drivers kept (the `aes` block cipher's among them).
fn drivers(entries: Vec<proc_crypto::AlgEntry>) -> Vec<DriverId> {
    let mut drivers: Vec<DriverId> = entries
        .into_iter()
        .filter(|e| {
            !e.internal && !e.driver.contains('(') && KERNEL_ALGORITHMS.contains(&e.name.as_str())
        })
        .map(|e| DriverId {
            algorithm: e.name,
            driver: e.driver,
            priority: e.priority,
        })
        .collect();
    drivers.sort();
    drivers.dedup();
    drivers
}

/// What reading the store found. Only [`Loaded::Ok`] carries a calibration; every
/// other outcome is worth one warning ([`Loaded::warning`]) and then ignoring.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Loaded {
    /// A calibration that holds on this machine.
    Ok(Box<Calibration>),
    /// No store file: nothing was calibrated yet (not worth a warning).
    Missing,
    /// A well-formed store that does not hold here (another machine, kernel, driver,
    /// version, or format).
    Stale {
        /// Why, in words.
        why: String,
    },
    /// A file that is not a calibration store (torn, edited, something else).
    Corrupt {
        /// What is wrong, in words.
        why: String,
    },
    /// A file that exists but cannot be read (permissions, I/O error).
    Unreadable {
        /// The error, in words.
        why: String,
    },
}

impl Loaded {
    /// The calibration, if the store held one for this machine.
    pub fn calibration(self) -> Option<Calibration> {
        match self {
            Loaded::Ok(c) => Some(*c),
            _ => None,
        }
    }

    /// The one sentence to warn with about the store at `path`, or `None` when there
    /// is nothing to say (a valid store, or none at all).
    pub fn warning(&self, path: &Path) -> Option<String> {
        let path = path.display();
        let fix = "run `hetcrypt calibrate` to measure this machine again";
        match self {
            Loaded::Ok(_) | Loaded::Missing => None,
            Loaded::Stale { why } => Some(format!(
                "ignoring the calibration in {path}: {why}; {fix}"
            )),
            Loaded::Corrupt { why } => Some(format!(
                "ignoring the calibration in {path}: the file is not a valid calibration ({why}); {fix}"
            )),
            Loaded::Unreadable { why } => Some(format!(
                "ignoring the calibration in {path}: it cannot be read ({why})"
            )),
        }
    }
}

/// Reads the store at `path` and checks it against the machine `now`. Never fails:
/// whatever is wrong comes back as a [`Loaded`] variant.
pub fn load(path: &Path, now: &Fingerprint) -> Loaded {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Missing,
        Err(e) => return Loaded::Unreadable { why: e.to_string() },
    };
    /// The part every format version shares.
    #[derive(Deserialize)]
    struct Header {
        format: u32,
    }
    let header: Header = match serde_json::from_slice(&text) {
        Ok(h) => h,
        Err(e) => return Loaded::Corrupt { why: e.to_string() },
    };
    if header.format != FORMAT_VERSION {
        return Loaded::Stale {
            why: format!(
                "it is in store format {}, and this hetcrypt reads format {FORMAT_VERSION}",
                header.format
            ),
        };
    }
    let cal: Calibration = match serde_json::from_slice(&text) {
        Ok(c) => c,
        Err(e) => return Loaded::Corrupt { why: e.to_string() },
    };
    if let Some(why) = cal.fingerprint.mismatch(now) {
        return Loaded::Stale { why };
    }
    Loaded::Ok(Box::new(cal))
}

/// Where the store is: `explicit` if given, else `$HETCRYPT_CALIBRATION`, else
/// [`SYSTEM_PATH`] for root, else `$XDG_STATE_HOME/hetcrypt/calibration.json`, else
/// `~/.local/state/hetcrypt/calibration.json`. `None` only for a user with no home.
pub fn store_path(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = set(ENV_PATH) {
        return Some(p.into());
    }
    if nix::unistd::geteuid().is_root() {
        return Some(SYSTEM_PATH.into());
    }
    // The XDG spec ignores a relative path in the variable.
    if let Some(state) = set("XDG_STATE_HOME").filter(|p| Path::new(p).is_absolute()) {
        return Some(Path::new(&state).join(USER_FILE));
    }
    set("HOME").map(|home| Path::new(&home).join(".local/state").join(USER_FILE))
}

/// Finds and reads the store (see [`store_path`]); a user who has no store of their
/// own and named none reads the system one. Returns the path read, for the warning.
pub fn load_store(explicit: Option<&Path>, now: &Fingerprint) -> (PathBuf, Loaded) {
    let Some(path) = store_path(explicit) else {
        return (
            PathBuf::from(SYSTEM_PATH),
            load(Path::new(SYSTEM_PATH), now),
        );
    };
    let loaded = load(&path, now);
    let named = explicit.is_some() || std::env::var_os(ENV_PATH).is_some_and(|v| !v.is_empty());
    if matches!(loaded, Loaded::Missing) && !named && path != Path::new(SYSTEM_PATH) {
        let system = load(Path::new(SYSTEM_PATH), now);
        if !matches!(system, Loaded::Missing) {
            return (PathBuf::from(SYSTEM_PATH), system);
        }
    }
    (path, loaded)
}

impl Calibration {
    /// Writes the store to `path` atomically: into a temporary file in the same
    /// directory, flushed to disk, then renamed over `path`, so a reader sees the old
    /// file or the new one, never a torn one, and of two calibrations saving at once
    /// the last rename wins whole. Creates the directory; the file is readable by all
    /// (mode 0644: a calibration holds no secret, and other users' programs read the
    /// system one).
    pub fn save(&self, path: &Path) -> Result<()> {
        let fail = |e: std::io::Error| Error::Store {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).map_err(fail)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".calibration.")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(fail)?;
        let json = serde_json::to_vec_pretty(self).expect("a calibration always serialises");
        tmp.write_all(&json).map_err(fail)?;
        tmp.write_all(b"\n").map_err(fail)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let file = tmp.as_file();
            file.set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(fail)?;
            file.sync_all().map_err(fail)?;
        }
        tmp.persist(path).map_err(|e| fail(e.error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::cpu_and_module;
    use super::*;

    fn temp() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temporary directory")
    }

    #[test]
    fn store_round_trips() {
        let dir = temp();
        let path = dir.path().join("sub/dir/calibration.json");
        let cal = cpu_and_module();
        cal.save(&path).unwrap();
        let loaded = load(&path, &cal.fingerprint);
        assert!(loaded.warning(&path).is_none());
        assert_eq!(loaded.calibration(), Some(cal));
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["calibration.json"]);
    }

    #[test]
    fn missing_store_is_not_worth_a_warning() {
        let dir = temp();
        let path = dir.path().join("none.json");
        let loaded = load(&path, &Fingerprint::current());
        assert!(matches!(loaded, Loaded::Missing));
        assert!(loaded.warning(&path).is_none());
    }

    /// Each way a store can be wrong is ignored with one warning that names the file
    /// and says why.
    #[test]
    fn stale_foreign_corrupt_and_unreadable_stores_are_ignored_with_a_warning() {
        let dir = temp();
        let now = Fingerprint::current();
        type Change = Box<dyn Fn(&mut Calibration)>;
        let cases: Vec<(&str, Change, &str)> = vec![
            (
                "foreign",
                Box::new(|c| c.fingerprint.cpu_model = "Cortex-A8".into()),
                "another CPU ('Cortex-A8'",
            ),
            (
                "kernel",
                Box::new(|c| c.fingerprint.kernel = "5.10.0-old".into()),
                "Linux 5.10.0-old",
            ),
            (
                "driver",
                Box::new(|c| {
                    c.fingerprint.drivers.push(DriverId {
                        algorithm: "cbc(aes)".into(),
                        driver: "gone_driver".into(),
                        priority: Some(4001),
                    })
                }),
                "gone: gone_driver (priority 4001)",
            ),
            (
                "version",
                Box::new(|c| c.fingerprint.hetcrypt = "0.0.1".into()),
                "hetcrypt 0.0.1",
            ),
            (
                "format",
                Box::new(|c| c.format = FORMAT_VERSION + 1),
                "store format 3",
            ),
        ];
        for (name, change, says) in cases {
            let path = dir.path().join(format!("{name}.json"));
            let mut cal = cpu_and_module();
            change(&mut cal);
            cal.save(&path).unwrap();
            let loaded = load(&path, &now);
            assert!(matches!(loaded, Loaded::Stale { .. }), "{name}: {loaded:?}");
            let warning = loaded.warning(&path).expect("a warning");
            assert!(warning.contains(says), "{name}: {warning}");
            assert!(warning.contains(&path.display().to_string()), "{warning}");
            assert!(loaded.calibration().is_none());
        }
        let good = serde_json::to_string(&cpu_and_module()).unwrap();
        let wrong_shape = format!("{{\"format\": {FORMAT_VERSION}, \"engines\": 3}}");
        for (name, text) in [
            ("torn", &good[..good.len() / 2]),
            ("empty", ""),
            ("other-json", "{\"hello\": 1}"),
            ("wrong-shape", wrong_shape.as_str()),
            ("binary", "\u{0}\u{1}\u{2}"),
        ] {
            let path = dir.path().join(format!("{name}.json"));
            std::fs::write(&path, text).unwrap();
            let loaded = load(&path, &now);
            assert!(
                matches!(loaded, Loaded::Corrupt { .. }),
                "{name}: {loaded:?}"
            );
            assert!(loaded
                .warning(&path)
                .unwrap()
                .contains("not a valid calibration"));
        }
        // A directory where the file should be cannot be read as one.
        let path = dir.path().join("a-directory.json");
        std::fs::create_dir(&path).unwrap();
        let loaded = load(&path, &now);
        assert!(matches!(loaded, Loaded::Unreadable { .. }), "{loaded:?}");
        assert!(loaded.warning(&path).unwrap().contains("cannot be read"));
    }

    /// Writers that save at the same time (threads here; processes rename the same
    /// way) leave one whole calibration, and a reader never sees a torn file.
    #[test]
    fn concurrent_writers_leave_a_valid_store() {
        let dir = temp();
        let path = dir.path().join("calibration.json");
        let now = Fingerprint::current();
        let writers = 4;
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut seen = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match load(&path, &now) {
                        Loaded::Ok(_) => seen += 1,
                        Loaded::Missing => {}
                        other => panic!("a reader saw {other:?}"),
                    }
                }
                seen
            });
            let handles: Vec<_> = (0..writers)
                .map(|w| {
                    let path = &path;
                    s.spawn(move || {
                        for i in 0..25 {
                            let mut cal = cpu_and_module();
                            cal.measured_at = (w * 1000 + i) as u64;
                            cal.save(path).unwrap();
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().unwrap();
        });
        let cal = load(&path, &now).calibration().expect("a valid store");
        assert_eq!(cal.measured_at % 1000, 24, "some writer's last save");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
    }

    /// The testbed guest's AES drivers, as the fingerprint keeps them; template
    /// instances made on first use do not change it.
    #[test]
    fn fingerprint_keeps_registered_drivers_not_template_instances() {
        let text = include_str!("../engine/kernel/testdata/proc_crypto_debian_6.1_virtio.txt");
        let kept = drivers(proc_crypto::parse(text));
        let names: Vec<String> = kept
            .iter()
            .map(|d| format!("{} {} {}", d.algorithm, d.driver, d.priority.unwrap_or(-1)))
            .collect();
        assert_eq!(
            names,
            [
                "aes aes-aesni 300",
                "aes aes-generic 100",
                "cbc(aes) cbc-aes-aesni 400",
                "cbc(aes) virtio_crypto_aes_cbc 150",
                "ctr(aes) ctr-aes-aesni 400",
                "gcm(aes) generic-gcm-aesni 400",
            ]
        );
        let used = format!(
            "{text}\nname         : ctr(aes)\ndriver       : ctr(aes-generic)\nmodule       : kernel\npriority     : 100\ntype         : skcipher\n"
        );
        assert_eq!(drivers(proc_crypto::parse(&used)), kept);
    }

    #[test]
    fn explicit_path_comes_first() {
        let p = Path::new("/tmp/x/cal.json");
        assert_eq!(store_path(Some(p)).as_deref(), Some(p));
    }
}
