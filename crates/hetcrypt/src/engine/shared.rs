//! What a device engine (`kernel`, `devcrypto`) and all its lanes share: what it
//! serves, and the mark it sets at its first failure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::cipher::{Cipher, KeySize, Mode};
use crate::error::{Error, Result};

/// One algorithm a device engine serves, as far as choosing it for a cipher goes.
pub(crate) trait Serves {
    /// The modes it runs.
    fn modes(&self) -> &[Mode];
    /// The key sizes it accepted when probed.
    fn key_sizes(&self) -> &[KeySize];
}

/// Shared by a device engine and all its lanes.
#[derive(Debug)]
pub(crate) struct State<S> {
    /// The engine's name (`kernel:<driver>`, `devcrypto`, ...).
    pub(crate) name: String,
    /// What it serves, in the order it is looked up.
    pub(crate) served: Vec<S>,
    /// The kernel release, for error messages.
    pub(crate) release: String,
    /// Set at the engine's first failure of its own.
    poison: Poison,
}

impl<S: Serves> State<S> {
    /// A state with nothing failed yet.
    pub(crate) fn new(name: String, served: Vec<S>, release: String) -> Self {
        State {
            name,
            served,
            release,
            poison: Poison::default(),
        }
    }

    /// What serves `cipher`, if anything.
    pub(crate) fn served(&self, cipher: Cipher) -> Option<&S> {
        self.served
            .iter()
            .find(|s| s.modes().contains(&cipher.mode) && s.key_sizes().contains(&cipher.key_size))
    }

    /// Marks the engine failed; every lane stops using the device.
    pub(crate) fn poison(&self, reason: String) -> Error {
        self.poison.set(&self.name, reason)
    }

    /// Whether the engine has failed.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poison.is_set()
    }

    /// `Ok` while the engine has not failed.
    pub(crate) fn check_poison(&self) -> Result<()> {
        self.poison.check(&self.name)
    }
}

/// Set once, at an engine's first failure of its own (a device gone, a driver
/// error), and never cleared: every lane looks at it before touching the device, so a
/// failed device is sent no further request (on a vanished virtio-crypto device one
/// more request oopses the kernel).
#[derive(Debug, Default)]
struct Poison {
    set: AtomicBool,
    reason: OnceLock<String>,
}

impl Poison {
    /// Marks engine `engine` failed (the first reason stays) and returns the error
    /// the failing job reports.
    fn set(&self, engine: &str, reason: String) -> Error {
        let reason = self.reason.get_or_init(|| reason).clone();
        self.set.store(true, Ordering::Release);
        Error::EngineFailed {
            engine: engine.to_owned(),
            reason,
        }
    }

    /// Whether the engine has failed.
    fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// `Ok` while the engine has not failed; after, the error every later job gets.
    fn check(&self, engine: &str) -> Result<()> {
        if self.is_set() {
            return Err(Error::EngineFailed {
                engine: engine.to_owned(),
                reason: format!(
                    "stopped after an earlier failure: {}",
                    self.reason.get().map_or("unknown", String::as_str)
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_stays_and_every_later_check_fails_with_it() {
        let p = Poison::default();
        assert!(p.check("kernel").is_ok());
        assert!(!p.is_set());
        let first = p.set("kernel", "device gone".into());
        assert!(matches!(first, Error::EngineFailed { ref reason, .. } if reason == "device gone"));
        let second = p.set("kernel", "socket error".into());
        assert!(
            matches!(second, Error::EngineFailed { ref reason, .. } if reason == "device gone")
        );
        assert!(p.is_set());
        match p.check("kernel") {
            Err(Error::EngineFailed { engine, reason }) => {
                assert_eq!(engine, "kernel");
                assert_eq!(reason, "stopped after an earlier failure: device gone");
            }
            other => panic!("{other:?}"),
        }
    }
}
