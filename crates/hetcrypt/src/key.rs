//! Keys, registered once and referred to by id so engines can cache their contexts.

use std::collections::HashMap;
use std::fmt;
use std::sync::RwLock;

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::error::{Error, Result};

/// Secret key bytes. Zeroized on drop, never printed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct Key(Vec<u8>);

impl Key {
    /// Wraps key bytes (16, 24 or 32 for AES-128/192/256).
    pub fn new(bytes: Vec<u8>) -> Self {
        Key(bytes)
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes, redacted)", self.0.len())
    }
}

/// A registered key's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyId(pub u32);

/// The keys a dispatcher's lanes may use. Lanes look a key up only on a cache miss.
#[derive(Debug, Default)]
pub struct KeyStore {
    keys: RwLock<HashMap<KeyId, Key>>,
}

impl KeyStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a key and returns its id. Key lengths other than 16, 24 and 32 bytes
    /// are refused here rather than at every job.
    pub fn add(&self, key: Key) -> Result<KeyId> {
        if ![16, 24, 32].contains(&key.len()) {
            return Err(Error::InvalidKey { len: key.len() });
        }
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let id = KeyId(u32::try_from(keys.len()).unwrap_or(u32::MAX));
        keys.insert(id, key);
        Ok(id)
    }

    /// Calls `f` with the key's bytes (the bytes never leave the store's lock).
    pub fn with_key<T>(&self, id: KeyId, f: impl FnOnce(&Key) -> T) -> Result<T> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.get(&id).map(f).ok_or(Error::UnknownKey(id.0))
    }
}
