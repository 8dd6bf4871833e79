//! The mark a device engine sets at its first failure, shared by all its lanes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Set once, at an engine's first failure of its own (a device gone, a driver
/// error), and never cleared: every lane looks at it before touching the device, so a
/// failed device is sent no further request (on a vanished virtio-crypto device one
/// more request oopses the kernel).
#[derive(Debug, Default)]
pub(crate) struct Poison {
    set: AtomicBool,
    reason: OnceLock<String>,
}

impl Poison {
    /// Marks engine `engine` failed (the first reason stays) and returns the error
    /// the failing job reports.
    pub(crate) fn set(&self, engine: &str, reason: String) -> Error {
        let reason = self.reason.get_or_init(|| reason).clone();
        self.set.store(true, Ordering::Release);
        Error::EngineFailed {
            engine: engine.to_owned(),
            reason,
        }
    }

    /// Whether the engine has failed.
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// `Ok` while the engine has not failed; after, the error every later job gets.
    pub(crate) fn check(&self, engine: &str) -> Result<()> {
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
