//! A device lane's bounded cache of keyed sessions, and what it does when the device holds no more.
//!
//! A device session (a cryptodev session, a keyed AF_ALG transform) costs the device
//! state: QEMU's built-in virtio-crypto backend holds 256 sessions in all, two per key
//! (the 6.1 driver opens one to encrypt and one to decrypt at every `setkey`), so 128
//! keys across every process of the guest. A user with many keys (a file tree, a
//! server with many connections) must not run out, so each lane keeps at most a fixed
//! number of sessions and ends the least recently used one to open another. Where the
//! device is full all the same (other lanes, engines or processes hold the rest),
//! opening fails with the device's "no more sessions" error; the lane then ends its
//! least recently used session and tries once more. That error is the device's
//! resource limit, not a fault, so it never quarantines the engine (the lanes tell it
//! apart from a device that went away by the device's sysfs link, as before).

use std::collections::HashMap;
use std::hash::Hash;

/// The cache's hasher. A lane looks its session up on every request, twice (is it
/// there, then take it), and the standard SipHash of a kernel lane's key (a key id, an
/// algorithm name, a key size) was about a third of a 16-byte request's user-space
/// instructions (~570 of ~1,660, callgrind; docs/performance.md, "Nineteenth
/// session"). The keys come from the lane itself, never from outside, so SipHash's
/// reason (inputs chosen to flood one bucket) does not apply: `rustc-hash`'s FxHash does.
type CacheHasher = rustc_hash::FxBuildHasher;

/// How opening a session failed, as the cache needs to know it.
#[derive(Debug)]
pub(crate) enum OpenError<E> {
    /// The device holds no more sessions: worth one retry after ending one of ours.
    Exhausted(E),
    /// Anything else: returned as it is.
    Failed(E),
}

/// Sessions of one lane, keyed by `K`, at most `capacity` of them; the least recently
/// used is ended first.
#[derive(Debug)]
pub(crate) struct SessionCache<K, S> {
    capacity: usize,
    /// Counts uses, for least-recently-used eviction.
    clock: u64,
    entries: HashMap<K, (S, u64), CacheHasher>,
}

impl<K: Copy + Eq + Hash, S> SessionCache<K, S> {
    /// An empty cache of at most `capacity` sessions (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        SessionCache {
            capacity: capacity.max(1),
            clock: 0,
            entries: HashMap::default(),
        }
    }

    /// The session for `key`: the cached one, or one from `open`. Before opening into a
    /// full cache, the least recently used session is ended (`close`). If `open` finds
    /// the device full ([`OpenError::Exhausted`]), the least recently used session (if
    /// any) is ended and `open` is tried once more; its second error is returned
    /// whatever it is. An error from `close` is returned at once.
    pub(crate) fn get_or_open<E>(
        &mut self,
        key: K,
        mut open: impl FnMut() -> Result<S, OpenError<E>>,
        mut close: impl FnMut(S) -> Result<(), E>,
    ) -> Result<&mut S, E> {
        self.clock += 1;
        let now = self.clock;
        if !self.entries.contains_key(&key) {
            if self.entries.len() >= self.capacity {
                self.evict_oldest(&mut close)?;
            }
            let session = match open() {
                Ok(s) => s,
                Err(OpenError::Failed(e)) => return Err(e),
                Err(OpenError::Exhausted(_)) => {
                    self.evict_oldest(&mut close)?;
                    match open() {
                        Ok(s) => s,
                        Err(OpenError::Failed(e) | OpenError::Exhausted(e)) => return Err(e),
                    }
                }
            };
            self.entries.insert(key, (session, now));
        }
        let (session, used) = self
            .entries
            .get_mut(&key)
            .expect("present or inserted above");
        *used = now;
        Ok(session)
    }

    /// Ends the least recently used session, if there is one.
    fn evict_oldest<E>(&mut self, close: &mut impl FnMut(S) -> Result<(), E>) -> Result<(), E> {
        let oldest = self
            .entries
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(k, _)| *k);
        match oldest.and_then(|k| self.entries.remove(&k)) {
            Some((session, _)) => close(session),
            None => Ok(()),
        }
    }

    /// Removes (without ending them) the sessions whose key fails `keep`, and returns
    /// them, for the caller to end.
    pub(crate) fn take_unless(&mut self, mut keep: impl FnMut(&K) -> bool) -> Vec<S> {
        let gone: Vec<K> = self.entries.keys().filter(|k| !keep(k)).copied().collect();
        gone.into_iter()
            .filter_map(|k| self.entries.remove(&k).map(|(s, _)| s))
            .collect()
    }

    /// Removes every session, for the caller to end or park.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = S> + '_ {
        self.entries.drain().map(|(_, (s, _))| s)
    }

    /// How many sessions are cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no session is cached.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake device: numbered sessions, a limit on how many are open at once (the
    /// others' share already taken away), and a log of what was ended.
    struct FakeDevice {
        limit: usize,
        open: Vec<u32>,
        next: u32,
        ended: Vec<u32>,
        opens: usize,
        /// When set, every open fails with this (not the limit).
        broken: bool,
    }

    #[derive(Debug, PartialEq)]
    enum Fail {
        NoMoreSessions,
        Broken,
    }

    impl FakeDevice {
        fn new(limit: usize) -> Self {
            FakeDevice {
                limit,
                open: Vec::new(),
                next: 0,
                ended: Vec::new(),
                opens: 0,
                broken: false,
            }
        }

        fn open(&mut self) -> Result<u32, OpenError<Fail>> {
            self.opens += 1;
            if self.broken {
                return Err(OpenError::Failed(Fail::Broken));
            }
            if self.open.len() >= self.limit {
                return Err(OpenError::Exhausted(Fail::NoMoreSessions));
            }
            self.next += 1;
            self.open.push(self.next);
            Ok(self.next)
        }

        fn end(&mut self, id: u32) -> Result<(), Fail> {
            self.open.retain(|&s| s != id);
            self.ended.push(id);
            Ok(())
        }
    }

    /// Looks `key` up in `cache`, opening on `dev`.
    fn get(cache: &mut SessionCache<u8, u32>, dev: &mut FakeDevice, key: u8) -> Result<u32, Fail> {
        let dev = std::cell::RefCell::new(dev);
        cache
            .get_or_open(key, || dev.borrow_mut().open(), |s| dev.borrow_mut().end(s))
            .map(|s| *s)
    }

    #[test]
    fn a_cached_key_opens_nothing() {
        let mut dev = FakeDevice::new(100);
        let mut cache = SessionCache::new(4);
        let a = get(&mut cache, &mut dev, 1).unwrap();
        assert_eq!(get(&mut cache, &mut dev, 1).unwrap(), a);
        assert_eq!(dev.opens, 1);
    }

    #[test]
    fn a_full_cache_ends_its_least_recently_used_session_first() {
        let mut dev = FakeDevice::new(100);
        let mut cache = SessionCache::new(3);
        let s1 = get(&mut cache, &mut dev, 1).unwrap();
        let s2 = get(&mut cache, &mut dev, 2).unwrap();
        get(&mut cache, &mut dev, 3).unwrap();
        get(&mut cache, &mut dev, 1).unwrap(); // 2 is now the oldest
        get(&mut cache, &mut dev, 4).unwrap();
        assert_eq!(dev.ended, vec![s2]);
        assert_eq!(cache.len(), 3);
        assert_eq!(
            dev.open.len(),
            3,
            "the device never holds more than the cache"
        );
        assert_eq!(get(&mut cache, &mut dev, 1).unwrap(), s1, "1 stayed cached");
    }

    #[test]
    fn many_keys_live_within_the_device_limit() {
        // 1,000 keys through a 32-session lane on a device that holds 40.
        let mut dev = FakeDevice::new(40);
        let mut cache = SessionCache::new(32);
        for round in 0..3 {
            for key in 0..=255u8 {
                get(&mut cache, &mut dev, key).unwrap_or_else(|e| panic!("{round}/{key}: {e:?}"));
            }
        }
        assert!(dev.open.len() <= 32);
    }

    #[test]
    fn a_full_device_costs_one_eviction_and_one_retry() {
        // The device holds 2 more than others took: the cache (capacity 8) meets the
        // device's limit first.
        let mut dev = FakeDevice::new(2);
        let mut cache = SessionCache::new(8);
        let s1 = get(&mut cache, &mut dev, 1).unwrap();
        get(&mut cache, &mut dev, 2).unwrap();
        let opens = dev.opens;
        get(&mut cache, &mut dev, 3).unwrap();
        assert_eq!(dev.opens - opens, 2, "one refused open, one retry");
        assert_eq!(dev.ended, vec![s1]);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_device_full_of_other_lanes_sessions_fails_after_one_retry() {
        let mut dev = FakeDevice::new(0);
        let mut cache = SessionCache::new(8);
        assert_eq!(get(&mut cache, &mut dev, 1), Err(Fail::NoMoreSessions));
        assert_eq!(dev.opens, 2, "exactly one retry");
        assert!(cache.is_empty());
        // Room again (another lane ended its sessions): the next job opens.
        dev.limit = 1;
        assert!(get(&mut cache, &mut dev, 1).is_ok());
    }

    #[test]
    fn another_failure_is_not_retried() {
        let mut dev = FakeDevice::new(8);
        let mut cache = SessionCache::new(8);
        get(&mut cache, &mut dev, 1).unwrap();
        dev.broken = true;
        assert_eq!(get(&mut cache, &mut dev, 2), Err(Fail::Broken));
        assert_eq!(dev.opens, 2, "no retry");
        assert!(dev.ended.is_empty(), "nothing evicted for a broken device");
    }

    #[test]
    fn removed_keys_are_handed_back_to_end() {
        let mut dev = FakeDevice::new(8);
        let mut cache = SessionCache::new(8);
        let s1 = get(&mut cache, &mut dev, 1).unwrap();
        get(&mut cache, &mut dev, 2).unwrap();
        assert_eq!(cache.take_unless(|&k| k != 1), vec![s1]);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.drain().count(), 1);
        assert!(cache.is_empty());
    }

    #[test]
    fn the_hasher_tells_lane_keys_apart() {
        use std::hash::BuildHasher;
        let h = |k: &(u32, &str, u8)| CacheHasher::default().hash_one(k);
        let keys = [
            (1, "cbc(aes)", 16),
            (2, "cbc(aes)", 16),
            (1, "ctr(aes)", 16),
            (1, "cbc(aes)", 32),
            (1, "gcm(aes)", 16),
            (1, "cbc(aes)x", 16),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(h(a), h(b), "{a:?} {b:?}");
            }
        }
    }
}
