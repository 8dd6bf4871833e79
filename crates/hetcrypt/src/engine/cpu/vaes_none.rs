//! The VAES-512 lockstep's stand-in where the target is not x86-64: never available.

use crate::cipher::{KeySize, BLOCK_LEN};

/// Whether this CPU runs the VAES-512 path: never, on this target.
pub(crate) fn available() -> bool {
    false
}

/// A key schedule that cannot exist on this target.
pub(crate) enum RoundKeys {}

impl RoundKeys {
    /// Always `None`: there is no VAES here.
    pub(crate) fn new(_size: KeySize, _key: &[u8]) -> Option<Self> {
        None
    }
}

/// Never called: no [`RoundKeys`] can be made.
pub(crate) fn run_group<const Z: usize>(
    keys: &RoundKeys,
    _state: &mut [[u8; BLOCK_LEN]],
    _src: &[&[u8]],
    _dst: &mut [&mut [u8]],
    _len: usize,
) {
    match *keys {}
}
