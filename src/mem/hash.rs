//! The hash engine: records keyed by bytes, each with a "recently referenced" (REF) flag.
//!
//! Trio's hash hardware keeps records that PPE threads reach with lookup, insert and delete
//! XTXNs, and sets a per-record REF flag when a record is created and whenever a lookup
//! finds it (paper §5). Timer threads visit the records, test and clear each REF flag, and
//! treat a record whose flag was already clear as idle for at least one timer interval: that
//! is how Trio-ML finds blocks whose sources straggle. N timer threads each scan 1/N of the
//! table ([`HashTable::scan`] takes a slice `i` of `n`).
//!
//! A record holds its key (up to [`MAX_KEY_BYTES`] bytes) and one 64-bit value: either the
//! value itself or the address of a larger record in [`super::SharedMemory`] (as Trio-ML's
//! block records point at their aggregation buffers).
//!
//! The table is split into shards, each with its own lock (the hash engine's banks), chosen
//! by the key's hash, so threads working on different records rarely meet. A shard keeps its
//! first few records in its own cache lines, beside its lock, so that an XTXN's lines are
//! known from the key's hash and fetched together (`ShardRecords`). Slices of a scan
//! are ranges of shards, so a timer thread's scan of slice `i` touches only its shards.
//! The table's size is fixed at creation: an insert into a full table is refused.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::error::ConfigError;

/// Longest key, in bytes (Trio-ML's `job_id` + `block_id` take 5).
pub const MAX_KEY_BYTES: usize = 32;

/// Default number of shards.
pub const DEFAULT_HASH_SHARDS: usize = 1024;

/// A hash-table key: up to [`MAX_KEY_BYTES`] bytes, stored inline (no allocation). Bytes
/// past the key's length are always zero, so equality may compare the whole array, while
/// hashing reads only the key's own bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct HashKey {
    len: u8,
    bytes: [u8; MAX_KEY_BYTES],
}

impl std::hash::Hash for HashKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
    }
}

impl HashKey {
    /// A key from bytes; `None` if longer than [`MAX_KEY_BYTES`].
    pub fn new(key: &[u8]) -> Option<HashKey> {
        if key.len() > MAX_KEY_BYTES {
            return None;
        }
        let mut bytes = [0; MAX_KEY_BYTES];
        bytes[..key.len()].copy_from_slice(key);
        Some(HashKey {
            len: key.len() as u8,
            bytes,
        })
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Whether these are the key's bytes.
    #[inline(always)]
    fn is(&self, key: &[u8]) -> bool {
        self.as_bytes() == key
    }
}

/// A key's hash: one per hash XTXN, for its shard and its bucket in the shard alike. The
/// seed is fixed, so that runs are reproducible: the same keys land in the same shards and
/// buckets, and a scan visits them in the same order, run after run.
#[inline(always)]
fn hash_bytes(key: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    const SEED: u64 = 0x243f_6a88_85a3_08d3;
    foldhash::fast::FixedState::with_seed(SEED).hash_one(key)
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HashKey({:02x?})", self.as_bytes())
    }
}

/// Why a hash XTXN was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashError {
    /// The key is longer than [`MAX_KEY_BYTES`].
    KeyTooLong {
        /// The key's length.
        len: usize,
    },
    /// The table holds as many records as it was sized for.
    Full {
        /// The table's capacity.
        capacity: usize,
    },
}

impl fmt::Display for HashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HashError::KeyTooLong { len } => {
                write!(f, "hash key of {len} bytes is longer than {MAX_KEY_BYTES}")
            }
            HashError::Full { capacity } => write!(f, "hash table is full ({capacity} records)"),
        }
    }
}

impl std::error::Error for HashError {}

/// What [`HashTable::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// A new record was created with the given value (its REF flag set).
    New,
    /// A record with this key already existed; it keeps its value, returned here, and is
    /// marked referenced (as a lookup would).
    Existing(u64),
}

/// What a scan does with a record it visited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanAction {
    /// Keep the record.
    Keep,
    /// Delete the record.
    Delete,
    /// Keep the record with this value instead (e.g. an age kept in the value).
    Set(u64),
}

/// One record as the control plane lists it ([`HashTable::records`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashRecord {
    /// The key's bytes.
    pub key: Vec<u8>,
    /// The record's value.
    pub value: u64,
    /// Its REF flag: set on create and by lookups since the last scan visited it.
    pub referenced: bool,
}

/// A record in its shard: the key with its value and REF flag. In this order (`repr(C)`),
/// so that a record with a short key has its value, flag and key in its first 48 bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Record {
    value: u64,
    referenced: bool,
    key: HashKey,
}

/// Records a shard holds in its own lines, beside its lock, before its overflow table.
const IN_PLACE: usize = 6;

/// Bytes of a shard [`HashTable::locked`] asks for before it takes the lock: the first two
/// lines, with the lock, the tags and the first two places (see [`ShardRecords`]).
const SHARD_PREFETCH_BYTES: usize = 128;

/// One shard's records: up to [`IN_PLACE`] of them in place, each with a tag of its key's
/// hash, the rest in a `hashbrown` table.
///
/// Why in place: a hash XTXN on a shard nobody touched lately missed three lines one after
/// another: the lock's, then the `hashbrown` table's control bytes (their address is in the
/// table's header, under the lock), then the record's. In place, the records sit in the
/// shard's own lines, whose addresses the key's hash gives, and their misses overlap the
/// lock's. Most shards hold a few records (a table of `capacity` records in `shards` shards
/// averages `capacity / shards` when full); a shard holding more keeps them in its
/// overflow table, as every shard did before.
///
/// Why in this order (`repr(C)`): the lock, the tags, `spilled` and the first place share
/// the shard's first line, and an insert takes the first empty place, so in a shard of one
/// or two records an XTXN needs the first line or two of the six the shard spans.
/// [`HashTable::locked`] asks for those two ([`SHARD_PREFETCH_BYTES`]) before it takes the
/// lock; asking for all six, as it did, filled the core's line fill buffers with lines no
/// XTXN read, while Trio-ML's adds streamed through them.
#[repr(C)]
struct ShardRecords {
    /// One per place: 0 for an empty place, else [`tag`] of its record's key's hash.
    tags: [u8; IN_PLACE],
    /// Whether `more` holds records: read where the tags are, so that a key in no place
    /// is known to be absent without a look at the overflow table's header.
    spilled: bool,
    places: [Record; IN_PLACE],
    /// The records past the places, placed by their keys' [`hash_bytes`]; empty (and
    /// unallocated) in most shards: it is sized only when its first record comes.
    more: hashbrown::HashTable<Record>,
    /// Records `more` is sized for when its first record comes: the shard's share of the
    /// table's capacity past the places. Sizing it up front cost every shard its share,
    /// used or not (gigabytes for a large table of mostly small shards).
    more_capacity: usize,
}

/// A hash's tag: its top seven bits, with the top bit set so that no tag is 0 (an empty
/// place). The shard is picked from bits 32 and up, `hashbrown`'s buckets from the low bits.
#[inline(always)]
fn tag(h: u64) -> u8 {
    (h >> 57) as u8 | 0x80
}

impl ShardRecords {
    fn new(capacity: usize) -> ShardRecords {
        const EMPTY: Record = Record {
            key: HashKey {
                len: 0,
                bytes: [0; MAX_KEY_BYTES],
            },
            value: 0,
            referenced: false,
        };
        ShardRecords {
            tags: [0; IN_PLACE],
            spilled: false,
            places: [EMPTY; IN_PLACE],
            more: hashbrown::HashTable::new(),
            more_capacity: capacity.saturating_sub(IN_PLACE),
        }
    }

    /// The place of the record with key `key` (hash `h`), if it is in place.
    #[inline(always)]
    fn place_of(&self, h: u64, key: &[u8]) -> Option<usize> {
        let t = tag(h);
        (0..IN_PLACE).find(|&i| self.tags[i] == t && self.places[i].key.is(key))
    }

    #[inline(always)]
    fn find(&self, h: u64, key: &[u8]) -> Option<&Record> {
        match self.place_of(h, key) {
            Some(i) => Some(&self.places[i]),
            None if !self.spilled => None,
            None => self.more.find(h, |r| r.key.is(key)),
        }
    }

    #[inline(always)]
    fn find_mut(&mut self, h: u64, key: &[u8]) -> Option<&mut Record> {
        match self.place_of(h, key) {
            Some(i) => Some(&mut self.places[i]),
            None if !self.spilled => None,
            None => self.more.find_mut(h, |r| r.key.is(key)),
        }
    }

    /// Adds a record whose key is in no record of the shard.
    fn insert_new(&mut self, h: u64, record: Record) {
        match self.tags.iter().position(|&t| t == 0) {
            Some(i) => {
                self.tags[i] = tag(h);
                self.places[i] = record;
            }
            None => {
                let rehash = |r: &Record| hash_bytes(r.key.as_bytes());
                if self.more.capacity() == 0 {
                    // The shard's first record past its places: size the table once, for
                    // its share, so that it does not grow step by step under the lock.
                    self.more.reserve(self.more_capacity.max(1), rehash);
                }
                self.more.insert_unique(h, record, rehash);
                self.spilled = true;
            }
        }
    }

    /// Removes the record with key `key` (hash `h`); a record of the overflow table takes
    /// its place.
    fn remove(&mut self, h: u64, key: &[u8]) -> Option<Record> {
        let Some(i) = self.place_of(h, key) else {
            if !self.spilled {
                return None;
            }
            let removed = match self.more.find_entry(h, |r| r.key.is(key)) {
                Ok(r) => Some(r.remove().0),
                Err(_) => None,
            };
            self.spilled = !self.more.is_empty();
            return removed;
        };
        let removed = self.places[i];
        self.tags[i] = 0;
        self.refill(i);
        Some(removed)
    }

    /// Moves a record of the overflow table, if any, into the empty place `i`.
    fn refill(&mut self, i: usize) {
        if !self.spilled {
            return;
        }
        // The first record the overflow table yields; the iterator, dropped, keeps the rest.
        if let Some(r) = self.more.extract_if(|_| true).next() {
            self.tags[i] = tag(hash_bytes(r.key.as_bytes()));
            self.places[i] = r;
        }
        self.spilled = !self.more.is_empty();
    }

    fn iter(&self) -> impl Iterator<Item = &Record> {
        (0..IN_PLACE)
            .filter(|&i| self.tags[i] != 0)
            .map(|i| &self.places[i])
            .chain(self.more.iter())
    }

    /// Keeps the records for which `keep` returns true, in place first.
    fn retain(&mut self, mut keep: impl FnMut(&mut Record) -> bool) {
        for i in 0..IN_PLACE {
            if self.tags[i] != 0 && !keep(&mut self.places[i]) {
                self.tags[i] = 0;
            }
        }
        if self.spilled {
            self.more.retain(&mut keep);
            self.spilled = !self.more.is_empty();
            for i in 0..IN_PLACE {
                if self.tags[i] == 0 {
                    self.refill(i);
                }
            }
        }
    }
}

/// One shard of the table: its records under its own lock (one bank of the engine), placed
/// by their keys' [`hash_bytes`].
type Shard = CachePadded<Mutex<ShardRecords>>;

/// A hash table of the hash engine. Share it through an `Arc`; every method takes `&self`.
pub struct HashTable {
    shards: Box<[Shard]>,
    capacity: usize,
    len: CachePadded<AtomicUsize>,
}

impl fmt::Debug for HashTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashTable")
            .field("capacity", &self.capacity)
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .finish()
    }
}

impl HashTable {
    /// A table for at most `capacity` records in `shards` shards (a power of two).
    pub fn new(capacity: usize, shards: usize) -> Result<HashTable, ConfigError> {
        if capacity == 0 || capacity > 1 << 28 {
            return Err(ConfigError::new(
                "hash_capacity",
                format!("{capacity} is out of range; accepted 1..={}", 1 << 28),
            ));
        }
        if !shards.is_power_of_two() || shards > 1 << 16 {
            return Err(ConfigError::new(
                "hash_shards",
                format!("{shards} must be a power of two from 1 to {}", 1 << 16),
            ));
        }
        let per_shard = capacity.div_ceil(shards);
        Ok(HashTable {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(ShardRecords::new(per_shard.min(1024)))))
                .collect(),
            capacity,
            len: CachePadded::new(AtomicUsize::new(0)),
        })
    }

    /// Records the table may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Shards (and so the most slices a scan can be split into).
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Records in the table now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when the table holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key's hash, or the error for a key that is too long.
    #[inline(always)]
    fn hash(&self, key: &[u8]) -> Result<u64, HashError> {
        if key.len() > MAX_KEY_BYTES {
            return Err(HashError::KeyTooLong { len: key.len() });
        }
        Ok(hash_bytes(key))
    }

    /// The shard of a key with hash `h`, locked: bits the shard's own table does not use for
    /// its buckets (the low bits) or its tags (the top seven). Its lines are asked for
    /// before the lock is taken, so that the misses of the records in place overlap the
    /// lock's (see [`ShardRecords`]).
    #[inline(always)]
    fn locked(&self, h: u64) -> parking_lot::MutexGuard<'_, ShardRecords> {
        let shard = &self.shards[(h >> 32) as usize & (self.shards.len() - 1)];
        crate::isa::prefetch_range((shard as *const Shard).cast::<u8>(), SHARD_PREFETCH_BYTES);
        shard.lock()
    }

    /// `f` of the key's record, under its shard's lock, once the record is marked
    /// referenced; `None` if there is no such record.
    #[inline(always)]
    fn referenced<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&mut Record) -> R,
    ) -> Result<Option<R>, HashError> {
        let h = self.hash(key)?;
        let mut shard = self.locked(h);
        Ok(shard.find_mut(h, key).map(|r| {
            r.referenced = true;
            f(r)
        }))
    }

    /// Looks a key up; a found record is marked referenced.
    pub fn lookup(&self, key: &[u8]) -> Result<Option<u64>, HashError> {
        self.referenced(key, |r| r.value)
    }

    /// Looks a key up without marking the record referenced: for the control plane, whose
    /// reads must not keep records alive.
    pub fn peek(&self, key: &[u8]) -> Result<Option<u64>, HashError> {
        let h = self.hash(key)?;
        Ok(self.locked(h).find(h, key).map(|r| r.value))
    }

    /// Creates a record unless one with the key exists (then that one is returned and
    /// marked referenced): of several threads inserting the same key at once, exactly one
    /// creates it and the others learn its value.
    pub fn insert(&self, key: &[u8], value: u64) -> Result<Inserted, HashError> {
        let h = self.hash(key)?;
        let mut shard = self.locked(h);
        if let Some(r) = shard.find_mut(h, key) {
            r.referenced = true;
            return Ok(Inserted::Existing(r.value));
        }
        // Reserve room before inserting, so the table never holds more than its capacity.
        let reserved = self
            .len
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(HashError::Full {
                capacity: self.capacity,
            });
        }
        let record = Record {
            key: HashKey::new(key).expect("the length was checked"),
            value,
            referenced: true,
        };
        shard.insert_new(h, record);
        Ok(Inserted::New)
    }

    /// Replaces the value of an existing record (marking it referenced); returns the old
    /// value, or `None` if there is no such record.
    pub fn update(&self, key: &[u8], value: u64) -> Result<Option<u64>, HashError> {
        self.referenced(key, |r| std::mem::replace(&mut r.value, value))
    }

    /// Replaces the value of an existing record only if it is still `expected` (then marking
    /// the record referenced); returns the value found, or `None` if there is no such
    /// record. The record holds `value` now exactly when that is `Some(expected)`: a
    /// read-decide-replace of one record by several threads, without losing an update made
    /// between the read and the replace.
    pub fn compare_update(
        &self,
        key: &[u8],
        expected: u64,
        value: u64,
    ) -> Result<Option<u64>, HashError> {
        let h = self.hash(key)?;
        let mut shard = self.locked(h);
        Ok(shard.find_mut(h, key).map(|r| {
            let found = r.value;
            if found == expected {
                r.value = value;
                r.referenced = true;
            }
            found
        }))
    }

    /// Deletes a record only if its value is still `expected`; returns the value found, or
    /// `None` if there is no such record. The record is gone exactly when that is
    /// `Some(expected)`: a thread that found a record stale removes it without removing one
    /// put in its place meanwhile.
    pub fn compare_delete(&self, key: &[u8], expected: u64) -> Result<Option<u64>, HashError> {
        let h = self.hash(key)?;
        let mut shard = self.locked(h);
        let found = shard.find_mut(h, key).map(|r| r.value);
        if found == Some(expected) {
            shard.remove(h, key);
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(found)
    }

    /// Deletes a record; returns its value, or `None` if there was none.
    pub fn delete(&self, key: &[u8]) -> Result<Option<u64>, HashError> {
        let h = self.hash(key)?;
        let removed = self.locked(h).remove(h, key);
        if removed.is_some() {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(removed.map(|r| r.value))
    }

    /// Every record with its REF flag as it stands, sorted by key: the control plane's
    /// listing. Unlike [`HashTable::scan`] it clears no REF flag, and unlike
    /// [`HashTable::lookup`] it sets none, so listing a table does not change which records
    /// the aging timers find idle (as [`HashTable::peek`] for one record). Takes each shard's
    /// lock in turn: a record inserted or deleted meanwhile may or may not be listed.
    pub fn records(&self) -> Vec<HashRecord> {
        let mut out = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            out.extend(shard.lock().iter().map(|r| HashRecord {
                key: r.key.as_bytes().to_vec(),
                value: r.value,
                referenced: r.referenced,
            }));
        }
        out.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Visits slice `slice` of `slices` (a range of shards; `slices` at most
    /// [`HashTable::shards`]): for each record, tests and clears its REF flag and calls
    /// `visit(key, value, was_referenced)`, which decides whether the record stays. Returns
    /// how many records were visited.
    ///
    /// # Panics
    /// If `slices` is 0 or more than the shard count, or `slice >= slices`: a scan
    /// configuration error, caught when timers are set up.
    pub fn scan(
        &self,
        slice: usize,
        slices: usize,
        mut visit: impl FnMut(&[u8], u64, bool) -> ScanAction,
    ) -> usize {
        let shards = self.shards.len();
        assert!(
            slices >= 1 && slices <= shards && slice < slices,
            "scan slice {slice} of {slices}: slices must be 1..={shards} and slice < slices"
        );
        let (first, end) = (slice * shards / slices, (slice + 1) * shards / slices);
        let mut visited = 0;
        for shard in &self.shards[first..end] {
            let mut shard = shard.lock();
            let mut deleted = 0;
            shard.retain(|r| {
                visited += 1;
                let was = std::mem::replace(&mut r.referenced, false);
                match visit(r.key.as_bytes(), r.value, was) {
                    ScanAction::Keep => true,
                    ScanAction::Set(value) => {
                        r.value = value;
                        true
                    }
                    ScanAction::Delete => {
                        deleted += 1;
                        false
                    }
                }
            });
            if deleted > 0 {
                self.len.fetch_sub(deleted, Ordering::AcqRel);
            }
        }
        visited
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(job: u8, block: u32) -> [u8; 5] {
        let b = block.to_be_bytes();
        [job, b[0], b[1], b[2], b[3]]
    }

    /// The lock, the tags and the first place share a shard's first line, and the second
    /// place ends within the lines `locked` asks for: what [`SHARD_PREFETCH_BYTES`] relies on.
    #[test]
    fn a_shards_lock_tags_and_first_places_sit_in_its_first_lines() {
        let t = HashTable::new(16, 1).unwrap();
        let shard: &Shard = &t.shards[0];
        let base = (shard as *const Shard).addr();
        let offset = |p: *const u8| p.addr() - base;
        // The lock is the mutex's only other field: before the records, in the first line.
        let records = offset(shard.data_ptr().cast_const().cast());
        assert!(
            (1..=8).contains(&records),
            "records at {records}: the lock first"
        );
        let g = shard.lock();
        let end = |p: *const u8, bytes: usize| offset(p) + bytes;
        assert!(end(g.tags.as_ptr(), IN_PLACE) <= 64);
        assert!(end((&raw const g.spilled).cast(), 1) <= 64);
        let record = std::mem::size_of::<Record>();
        assert!(end((&raw const g.places[0]).cast(), record) <= 64);
        assert!(end((&raw const g.places[1]).cast(), record) <= SHARD_PREFETCH_BYTES);
    }

    /// A shard's overflow table takes no memory until a record overflows its places: a
    /// large table of mostly small shards would otherwise allocate every shard's share up
    /// front. The first overflowing record sizes it for the shard's share at once.
    #[test]
    fn a_shards_overflow_table_is_allocated_on_its_first_record() {
        let big = HashTable::new(1 << 20, 1 << 10).unwrap();
        assert!(
            big.shards.iter().all(|s| s.lock().more.capacity() == 0),
            "no overflow table allocated before a record overflows"
        );
        let t = HashTable::new(64, 1).unwrap();
        for block in 0..IN_PLACE as u32 {
            t.insert(&key(1, block), 1).unwrap();
        }
        assert_eq!(t.shards[0].lock().more.capacity(), 0, "the places hold six");
        t.insert(&key(1, 99), 1).unwrap();
        let more = t.shards[0].lock().more.capacity();
        assert!(more >= 64 - IN_PLACE, "sized for the shard's share: {more}");
        assert_eq!(t.peek(&key(1, 99)).unwrap(), Some(1));
        assert_eq!(t.len(), IN_PLACE + 1);
    }

    /// A compare-delete removes only the value it was given, and of threads that found the
    /// same record, one removes it and none the record put in its place.
    #[test]
    fn compare_delete_removes_only_the_value_expected() {
        let t = HashTable::new(100, 4).unwrap();
        assert_eq!(t.compare_delete(&key(1, 7), 0), Ok(None));
        assert_eq!(t.insert(&key(1, 7), 70), Ok(Inserted::New));
        assert_eq!(t.compare_delete(&key(1, 7), 69), Ok(Some(70)));
        assert_eq!((t.len(), t.peek(&key(1, 7)).unwrap()), (1, Some(70)));
        assert_eq!(t.compare_delete(&key(1, 7), 70), Ok(Some(70)));
        assert_eq!((t.len(), t.peek(&key(1, 7)).unwrap()), (0, None));

        // 32 threads find the same stale record; one removes it, and never the record put in
        // its place, whatever the interleaving.
        let t = std::sync::Arc::new(HashTable::new(100, 4).unwrap());
        for round in 0..100u64 {
            t.insert(&key(2, 2), round).unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(32));
            let outcomes: Vec<(bool, bool)> = (0..32u64)
                .map(|_| {
                    let (t, barrier) = (t.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let gone = t.compare_delete(&key(2, 2), round).unwrap() == Some(round);
                        // In odd rounds the remover puts a new record in its place at once.
                        let put = gone && round % 2 == 1;
                        if put {
                            t.insert(&key(2, 2), 1_000 + round).unwrap();
                        }
                        (gone, put)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            let removed = outcomes.iter().filter(|o| o.0).count();
            let put = outcomes.iter().any(|o| o.1);
            assert_eq!(removed, 1, "round {round}");
            let left = t.peek(&key(2, 2)).unwrap();
            assert_eq!(left, put.then_some(1_000 + round), "round {round}");
            t.delete(&key(2, 2)).unwrap();
            assert_eq!(t.len(), 0);
        }
    }

    /// A compare-update replaces only the value it was given, marks only a record it
    /// changed referenced, and, looped, lets threads keep the largest of their values
    /// without losing one to a replace between another thread's read and its own.
    #[test]
    fn compare_update_replaces_only_the_value_expected() {
        let t = HashTable::new(100, 4).unwrap();
        assert_eq!(t.compare_update(&key(1, 7), 0, 5), Ok(None));
        assert_eq!(t.insert(&key(1, 7), 70), Ok(Inserted::New));
        t.scan(0, 1, |_, _, _| ScanAction::Keep);
        assert_eq!(t.compare_update(&key(1, 7), 69, 80), Ok(Some(70)));
        assert_eq!(t.records()[0].value, 70);
        assert!(
            !t.records()[0].referenced,
            "a compare that failed refers to nothing"
        );
        assert_eq!(t.compare_update(&key(1, 7), 70, 80), Ok(Some(70)));
        assert_eq!(
            (t.records()[0].value, t.records()[0].referenced),
            (80, true)
        );

        let t = std::sync::Arc::new(HashTable::new(100, 4).unwrap());
        t.insert(&key(2, 2), 0).unwrap();
        let threads: Vec<_> = (0..64u64)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let mine = (round * 64 + i) * 7919 % 12_800;
                        let mut seen = t.peek(&key(2, 2)).unwrap().unwrap();
                        while seen < mine {
                            match t.compare_update(&key(2, 2), seen, mine).unwrap() {
                                Some(v) if v == seen => break,
                                Some(v) => seen = v,
                                None => unreachable!("the record stays"),
                            }
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let max = (0..64u64)
            .flat_map(|i| (0..200u64).map(move |r| (r * 64 + i) * 7919 % 12_800))
            .max()
            .unwrap();
        assert_eq!(t.peek(&key(2, 2)), Ok(Some(max)));
    }

    #[test]
    fn insert_lookup_update_delete() {
        let t = HashTable::new(100, 16).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.insert(&key(1, 7), 70), Ok(Inserted::New));
        assert_eq!(t.insert(&key(1, 7), 99), Ok(Inserted::Existing(70)));
        assert_eq!(t.lookup(&key(1, 7)), Ok(Some(70)));
        assert_eq!(t.lookup(&key(2, 7)), Ok(None));
        assert_eq!(t.update(&key(1, 7), 71), Ok(Some(70)));
        assert_eq!(t.update(&key(9, 9), 1), Ok(None));
        assert_eq!(t.len(), 1);
        assert_eq!(t.delete(&key(1, 7)), Ok(Some(71)));
        assert_eq!(t.delete(&key(1, 7)), Ok(None));
        assert!(t.is_empty());
    }

    #[test]
    fn keys_are_bytes_of_any_length_up_to_the_limit() {
        let t = HashTable::new(10, 4).unwrap();
        t.insert(b"", 1).unwrap();
        t.insert(b"a", 2).unwrap();
        t.insert(&[7; MAX_KEY_BYTES], 3).unwrap();
        assert_eq!(t.lookup(b"").unwrap(), Some(1));
        assert_eq!(t.lookup(b"a\0").unwrap(), None, "length is part of the key");
        assert_eq!(t.lookup(&[7; MAX_KEY_BYTES]).unwrap(), Some(3));
        assert_eq!(
            t.insert(&[0; MAX_KEY_BYTES + 1], 4),
            Err(HashError::KeyTooLong { len: 33 })
        );
        assert_eq!(t.lookup(&[0; 40]), Err(HashError::KeyTooLong { len: 40 }));
    }

    #[test]
    fn a_full_table_refuses_new_records_but_finds_old_ones() {
        let t = HashTable::new(3, 2).unwrap();
        for i in 0..3 {
            assert_eq!(t.insert(&key(0, i), i as u64), Ok(Inserted::New));
        }
        assert_eq!(
            t.insert(&key(0, 3), 3),
            Err(HashError::Full { capacity: 3 })
        );
        assert_eq!(t.insert(&key(0, 1), 9), Ok(Inserted::Existing(1)));
        t.delete(&key(0, 0)).unwrap();
        assert_eq!(t.insert(&key(0, 3), 3), Ok(Inserted::New));
    }

    #[test]
    fn records_lists_every_record_and_leaves_ref_flags_alone() {
        let t = HashTable::new(1000, 8).unwrap();
        for b in 0..20 {
            t.insert(&key(1, b), 100 + b as u64).unwrap();
        }
        t.scan(0, 1, |_, _, _| ScanAction::Keep);
        for b in (0..20).step_by(3) {
            t.lookup(&key(1, b)).unwrap();
        }
        let referenced = |b: u32| b.is_multiple_of(3);
        let want: Vec<HashRecord> = (0..20)
            .map(|b| HashRecord {
                key: key(1, b).to_vec(),
                value: 100 + b as u64,
                referenced: referenced(b),
            })
            .collect();
        // Listed twice: the first listing changed no flag the second (or a scan) sees.
        assert_eq!(t.records(), want);
        assert_eq!(t.records(), want);
        let mut seen = Vec::new();
        t.scan(0, 1, |k, _, was| {
            seen.push((k.to_vec(), was));
            ScanAction::Keep
        });
        seen.sort();
        let flags: Vec<(Vec<u8>, bool)> = want.into_iter().map(|r| (r.key, r.referenced)).collect();
        assert_eq!(
            seen, flags,
            "the scan after the listings saw the REF flags as they were"
        );
        assert!(
            t.records().iter().all(|r| !r.referenced),
            "the scan cleared them"
        );
    }

    #[test]
    fn ref_flags_are_set_on_create_and_lookup_and_cleared_by_scans() {
        let t = HashTable::new(1000, 8).unwrap();
        for b in 0..100 {
            t.insert(&key(1, b), b as u64).unwrap();
        }
        // First scan: every record was just created, so every REF flag was set.
        let mut seen = Vec::new();
        let n = t.scan(0, 1, |k, v, was| {
            seen.push((k.to_vec(), v, was));
            ScanAction::Keep
        });
        assert_eq!(n, 100);
        assert!(seen.iter().all(|(_, _, was)| *was));
        // Look up the even blocks only; the next scan sees exactly those referenced, and
        // deletes the idle odd ones.
        for b in (0..100).step_by(2) {
            t.lookup(&key(1, b)).unwrap();
        }
        let mut idle = Vec::new();
        t.scan(0, 1, |_, v, was| {
            if was {
                ScanAction::Keep
            } else {
                idle.push(v);
                ScanAction::Delete
            }
        });
        idle.sort();
        assert_eq!(
            idle,
            (1..100).step_by(2).map(|b| b as u64).collect::<Vec<_>>()
        );
        assert_eq!(t.len(), 50);
    }

    #[test]
    fn scans_can_set_values_and_peeks_leave_ref_flags_alone() {
        let t = HashTable::new(100, 4).unwrap();
        for b in 0..10 {
            t.insert(&key(1, b), b as u64).unwrap();
        }
        // Every value gets 100 added; the REF flags (all set by the inserts) are cleared.
        t.scan(0, 1, |_, v, _| ScanAction::Set(v + 100));
        assert_eq!(t.peek(&key(1, 3)), Ok(Some(103)));
        assert_eq!(t.peek(&key(1, 10)), Ok(None));
        // Peeks do not mark records referenced; lookups do.
        t.lookup(&key(1, 4)).unwrap();
        let mut referenced = Vec::new();
        t.scan(0, 1, |_, v, was| {
            if was {
                referenced.push(v);
            }
            ScanAction::Keep
        });
        assert_eq!(referenced, vec![104]);
        assert_eq!(t.len(), 10);
    }

    #[test]
    fn slices_partition_the_table() {
        let t = HashTable::new(10_000, 64).unwrap();
        for b in 0..5_000 {
            t.insert(&key(3, b), b as u64).unwrap();
        }
        for slices in [1, 3, 7, 64] {
            let mut all = Vec::new();
            for i in 0..slices {
                t.scan(i, slices, |_, v, _| {
                    all.push(v);
                    ScanAction::Keep
                });
            }
            all.sort();
            assert_eq!(all, (0..5_000).collect::<Vec<u64>>(), "{slices} slices");
        }
    }

    #[test]
    fn keys_spread_over_every_shard() {
        // One slice per shard: each scan sees exactly one shard's records.
        let shards = 64;
        let t = HashTable::new(10_000, shards).unwrap();
        let keys = 6_400;
        for b in 0..keys {
            t.insert(&key(3, b), 0).unwrap();
        }
        let per_shard: Vec<usize> = (0..shards)
            .map(|i| t.scan(i, shards, |_, _, _| ScanAction::Keep))
            .collect();
        assert_eq!(per_shard.iter().sum::<usize>(), keys as usize);
        let mean = keys as usize / shards;
        // A binomial count of mean 100 stays well inside these bounds; a hash that left
        // shard bits unused (or took them from the bucket index) would not.
        assert!(
            per_shard.iter().all(|&n| n > mean / 2 && n < 2 * mean),
            "records per shard: {per_shard:?}"
        );
    }

    #[test]
    fn concurrent_inserts_of_one_key_create_exactly_one_record() {
        let t = Arc::new(HashTable::new(100_000, 256).unwrap());
        let created: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..64u64)
                .map(|th| {
                    let t = t.clone();
                    s.spawn(move || {
                        (0..500u32)
                            .filter(|&b| t.insert(&key(0, b), th).unwrap() == Inserted::New)
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(created, 500);
        assert_eq!(t.len(), 500);
    }

    /// One step of [`the_table_is_a_map_with_ref_flags`].
    #[derive(Clone, Debug)]
    enum Step {
        Insert(u8, u64),
        Lookup(u8),
        Peek(u8),
        Update(u8, u64),
        Delete(u8),
        /// A scan of the whole table: deletes the records whose value is odd, sets those
        /// whose value is divisible by 3 to value / 3, keeps the others.
        Scan,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        // Few keys, so that steps meet the same records; values small, so that scans
        // delete, set and keep.
        prop_oneof![
            (0..40u8, 0..64u64).prop_map(|(k, v)| Step::Insert(k, v)),
            (0..40u8).prop_map(Step::Lookup),
            (0..40u8).prop_map(Step::Peek),
            (0..40u8, 0..64u64).prop_map(|(k, v)| Step::Update(k, v)),
            (0..40u8).prop_map(Step::Delete),
            Just(Step::Scan),
        ]
    }

    proptest::proptest! {
        /// Against a map of keys to (value, REF flag), through every operation, with few
        /// shards, so that shards hold more records than they keep in place (and deletes
        /// move records of the overflow table into the places they free). Keys of 1 to 9
        /// bytes.
        #[test]
        fn the_table_is_a_map_with_ref_flags(
            shards in proptest::sample::select(vec![1usize, 2, 4, 16]),
            steps in proptest::collection::vec(step(), 1..300),
        ) {
            use std::collections::BTreeMap;
            let t = HashTable::new(32, shards).unwrap();
            let mut model: BTreeMap<Vec<u8>, (u64, bool)> = BTreeMap::new();
            let key = |k: u8| vec![k; 1 + usize::from(k) % 9];
            for s in steps {
                match s {
                    Step::Insert(k, v) => {
                        let got = t.insert(&key(k), v);
                        let full = model.len() == 32;
                        let want = match model.get_mut(&key(k)) {
                            Some((old, r)) => {
                                *r = true;
                                Ok(Inserted::Existing(*old))
                            }
                            None if full => Err(HashError::Full { capacity: 32 }),
                            None => {
                                model.insert(key(k), (v, true));
                                Ok(Inserted::New)
                            }
                        };
                        proptest::prop_assert_eq!(got, want);
                    }
                    Step::Lookup(k) => {
                        let want = model.get_mut(&key(k)).map(|(v, r)| {
                            *r = true;
                            *v
                        });
                        proptest::prop_assert_eq!(t.lookup(&key(k)), Ok(want));
                    }
                    Step::Peek(k) => {
                        let want = model.get(&key(k)).map(|(v, _)| *v);
                        proptest::prop_assert_eq!(t.peek(&key(k)), Ok(want));
                    }
                    Step::Update(k, v) => {
                        let want = model.get_mut(&key(k)).map(|(old, r)| {
                            *r = true;
                            std::mem::replace(old, v)
                        });
                        proptest::prop_assert_eq!(t.update(&key(k), v), Ok(want));
                    }
                    Step::Delete(k) => {
                        let want = model.remove(&key(k)).map(|(v, _)| v);
                        proptest::prop_assert_eq!(t.delete(&key(k)), Ok(want));
                    }
                    Step::Scan => {
                        let mut seen = BTreeMap::new();
                        let visited = t.scan(0, 1, |k, v, was| {
                            seen.insert(k.to_vec(), (v, was));
                            match v {
                                v if v % 2 == 1 => ScanAction::Delete,
                                v if v % 3 == 0 => ScanAction::Set(v / 3),
                                _ => ScanAction::Keep,
                            }
                        });
                        proptest::prop_assert_eq!(visited, model.len());
                        proptest::prop_assert_eq!(&seen, &model);
                        model = model
                            .into_iter()
                            .filter(|(_, (v, _))| v % 2 == 0)
                            .map(|(k, (v, _))| (k, (if v % 3 == 0 { v / 3 } else { v }, false)))
                            .collect();
                    }
                }
                proptest::prop_assert_eq!(t.len(), model.len());
            }
            let listed: Vec<(Vec<u8>, u64, bool)> =
                t.records().into_iter().map(|r| (r.key, r.value, r.referenced)).collect();
            let want: Vec<(Vec<u8>, u64, bool)> =
                model.into_iter().map(|(k, (v, r))| (k, v, r)).collect();
            proptest::prop_assert_eq!(listed, want);
        }
    }

    #[test]
    fn configuration_is_checked() {
        assert_eq!(HashTable::new(0, 4).unwrap_err().setting, "hash_capacity");
        assert_eq!(HashTable::new(10, 3).unwrap_err().setting, "hash_shards");
    }
}
