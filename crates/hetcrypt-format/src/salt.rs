//! Fresh random salts for messages, drawn from OpenSSL's generator many at a time.

use std::cell::RefCell;

use crate::error::Result;
use crate::SALT_LEN;

/// Salts drawn per call to the generator: one `RAND_bytes` (its parameter lookups,
/// locks and fork check cost 8.6% of the reading thread of a 4,000-file tree run, one
/// call a file) now serves this many messages. 64 x 24 bytes: 1.5 KiB per thread.
const SALTS_PER_DRAW: usize = 64;

/// One thread's salts drawn ahead, and the process they were drawn in.
struct Drawn {
    bytes: [u8; SALT_LEN * SALTS_PER_DRAW],
    /// Salts of `bytes` already handed out.
    used: usize,
    /// The process that drew them: a child forked since must draw its own, or parent
    /// and child would hand out the same salts.
    pid: u32,
}

impl Drawn {
    const fn empty() -> Self {
        Drawn {
            bytes: [0; SALT_LEN * SALTS_PER_DRAW],
            used: SALTS_PER_DRAW,
            pid: 0,
        }
    }

    /// The next salt, drawing a fresh set by `draw` when all are used or the process
    /// is not the one that drew them. Each salt is handed out once: its bytes are
    /// cleared as it goes.
    fn take(
        &mut self,
        pid: u32,
        draw: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<[u8; SALT_LEN]> {
        if self.used == SALTS_PER_DRAW || self.pid != pid {
            self.used = SALTS_PER_DRAW;
            draw(&mut self.bytes)?;
            self.used = 0;
            self.pid = pid;
        }
        let at = self.used * SALT_LEN;
        let slot = &mut self.bytes[at..at + SALT_LEN];
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(slot);
        slot.fill(0);
        self.used += 1;
        Ok(salt)
    }
}

thread_local! {
    static DRAWN: RefCell<Drawn> = const { RefCell::new(Drawn::empty()) };
}

/// A fresh random salt (from OpenSSL's CSPRNG, drawn ahead in sets of
/// [`SALTS_PER_DRAW`] per thread; redrawn after a fork).
pub(crate) fn fresh() -> Result<[u8; SALT_LEN]> {
    let pid = std::process::id();
    DRAWN.with_borrow_mut(|d| {
        d.take(pid, |bytes| {
            openssl::rand::rand_bytes(bytes)?;
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn salts_are_distinct_across_draws_and_threads() {
        let mine: Vec<_> = (0..3 * SALTS_PER_DRAW + 5)
            .map(|_| fresh().unwrap())
            .collect();
        let theirs: Vec<_> = std::thread::spawn(|| {
            (0..SALTS_PER_DRAW + 1)
                .map(|_| fresh().unwrap())
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        let all: HashSet<_> = mine.iter().chain(&theirs).collect();
        assert_eq!(all.len(), mine.len() + theirs.len());
        assert!(all.iter().all(|s| s.iter().any(|&b| b != 0)));
    }

    #[test]
    fn a_set_is_drawn_once_per_salts_per_draw_and_again_in_another_process() {
        let mut d = Drawn::empty();
        let draws = std::cell::Cell::new(0);
        // Every salt drawn is numbered in its first bytes.
        let numbered = std::cell::Cell::new(0u32);
        let draw = |bytes: &mut [u8]| {
            draws.set(draws.get() + 1);
            for salt in bytes.chunks_mut(SALT_LEN) {
                numbered.set(numbered.get() + 1);
                salt[..4].copy_from_slice(&numbered.get().to_le_bytes());
            }
            Ok(())
        };
        let first = d.take(7, draw).unwrap();
        for _ in 1..SALTS_PER_DRAW {
            assert_ne!(d.take(7, draw).unwrap(), first);
        }
        assert_eq!(draws.get(), 1);
        d.take(7, draw).unwrap();
        assert_eq!(draws.get(), 2, "a fresh set once all are used");
        // A forked child (another pid) never hands out what its parent drew.
        d.take(8, draw).unwrap();
        assert_eq!(draws.get(), 3, "a fresh set in another process");
        // A failed draw hands out nothing, and the next call draws again.
        let fail = |_: &mut [u8]| Err(crate::error::FormatError::Io(std::io::Error::other("no")));
        assert!(d.take(9, fail).is_err());
        d.take(9, draw).unwrap();
        assert_eq!(draws.get(), 4);
    }
}
