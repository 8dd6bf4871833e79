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
///
/// Ids are never reused: a removed key's id stays unknown, so a lane's context cached
/// for it can never be mistaken for another key's.
#[derive(Debug, Default)]
pub struct KeyStore {
    keys: RwLock<Keys>,
}

#[derive(Debug, Default)]
struct Keys {
    map: HashMap<KeyId, Key>,
    /// The id the next key gets.
    next: u32,
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
        let id = KeyId(keys.next);
        keys.next = keys.next.checked_add(1).ok_or(Error::TooManyKeys)?;
        keys.map.insert(id, key);
        Ok(id)
    }

    /// Removes a key; its bytes are zeroized as it drops. Jobs that name it fail with
    /// [`Error::UnknownKey`] from then on. A key of a [`crate::Dispatcher`] should be
    /// removed through [`crate::Dispatcher::remove_key`], which waits for a running
    /// batch to end (a lane looks a key up whenever its cache misses).
    pub fn remove(&self, id: KeyId) -> Result<()> {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        keys.map
            .remove(&id)
            .map(drop)
            .ok_or(Error::UnknownKey(id.0))
    }

    /// Whether `id` names a registered key (not removed).
    pub fn contains(&self, id: KeyId) -> bool {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.map.contains_key(&id)
    }

    /// Number of keys registered and not removed.
    pub fn len(&self) -> usize {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
    }

    /// Whether no key is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with the key's bytes (the bytes never leave the store's lock).
    pub fn with_key<T>(&self, id: KeyId, f: impl FnOnce(&Key) -> T) -> Result<T> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.map.get(&id).map(f).ok_or(Error::UnknownKey(id.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_keys_are_gone_and_their_ids_never_come_back() {
        let store = KeyStore::new();
        let a = store.add(Key::new(vec![1; 16])).unwrap();
        let b = store.add(Key::new(vec![2; 32])).unwrap();
        assert_eq!(store.len(), 2);
        store.remove(a).unwrap();
        assert!(matches!(store.with_key(a, |_| ()), Err(Error::UnknownKey(id)) if id == a.0));
        assert!(matches!(store.remove(a), Err(Error::UnknownKey(_))));
        assert_eq!(store.with_key(b, |k| k.as_bytes()[0]).unwrap(), 2);
        // A new key never takes the removed one's id (lanes cache contexts by id).
        let c = store.add(Key::new(vec![3; 16])).unwrap();
        assert!(c != a && c != b);
        assert_eq!(store.len(), 2);
        assert!(matches!(
            store.with_key(a, |_| ()),
            Err(Error::UnknownKey(_))
        ));
    }
}
