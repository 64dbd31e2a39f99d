//! Attacks on the shard's rankings (`rank.rs`): the lazily updated heaps must choose exactly
//! what a scan of the scopes chose (`git show a983612:layers/idempotency/src/store/memory/shard.rs`),
//! except that room for bytes now demotes instead of removing, and must stay proportional to
//! the scopes whatever the operations.

use super::rank::SCOPE_VISITS;
use super::shard::State;
use super::tests::{check_all, claimed, response, scoped, DAY, FP, LEASE};
use super::*;
use std::collections::{BTreeMap, HashMap};

fn done(store: &MemoryStore, key: StoreKey, len: usize, retention: Duration) {
    let t = claimed(store, key);
    assert!(store.do_complete(key, t, response(len), retention));
}

/// What `key` answers, without claiming it: "absent", "claim", "completed", "not-replayable".
fn peek(store: &MemoryStore, key: StoreKey) -> &'static str {
    let shard = lock(&store.inner.shards[0]);
    match shard.map.get(&key).map(|e| (&e.state, e.expires_at)) {
        None => "absent",
        Some((_, end)) if end <= Instant::now() => "absent",
        Some((State::InProgress { .. }, _)) => "claim",
        Some((State::Completed { .. }, _)) => "completed",
        Some((State::NotReplayable, _)) => "not-replayable",
    }
}

/// A store of one shard with exactly these bounds (the builder splits stores of 512 entries
/// or more over several shards).
fn one_shard(max_entries: usize, max_bytes: usize) -> MemoryStore {
    MemoryStore {
        inner: Arc::new(Inner {
            shards: vec![Mutex::new(shard::Shard::default())].into_boxed_slice(),
            max_entries_per_shard: max_entries,
            max_bytes_per_shard: max_bytes,
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// A reference: the previous scan-based shard, as a plain map scanned on every decision.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Debug)]
enum RefState {
    Held(ClaimToken),
    Done(usize),
    NotReplayable,
}

#[derive(Clone, Copy, PartialEq, Debug)]
struct RefRecord {
    scope: u64,
    expires: Instant,
    state: RefState,
}

#[derive(PartialEq, Debug)]
enum Answer {
    Claimed,
    Held,
    Completed,
    NotReplayable,
    Full,
}

/// The rules of the previous code, by scanning: expired records first, then who pays is the
/// scope holding the most (ties broken by the larger tag, as the heaps break them), the
/// claimer's own when no other holds strictly more; bytes demote instead of remove.
struct RefShard {
    map: BTreeMap<StoreKey, RefRecord>,
    max_entries: usize,
    max_bytes: usize,
}

impl RefShard {
    fn bytes(&self) -> usize {
        self.map
            .values()
            .map(|r| match r.state {
                RefState::Done(size) => size,
                _ => 0,
            })
            .sum()
    }

    /// entries, bytes, oldest completed, oldest replayable.
    #[allow(clippy::type_complexity)]
    fn scopes(
        &self,
    ) -> HashMap<
        u64,
        (
            usize,
            usize,
            Option<(Instant, StoreKey)>,
            Option<(Instant, StoreKey)>,
        ),
    > {
        let mut scopes: HashMap<u64, (usize, usize, Option<_>, Option<_>)> = HashMap::new();
        for (key, r) in &self.map {
            let u = scopes.entry(r.scope).or_default();
            u.0 += 1;
            let at = (r.expires, *key);
            let first = |cur: Option<(Instant, StoreKey)>| Some(cur.map_or(at, |c| c.min(at)));
            match r.state {
                RefState::Held(_) => {}
                RefState::Done(size) => {
                    u.1 += size;
                    u.2 = first(u.2);
                    u.3 = first(u.3);
                }
                RefState::NotReplayable => u.2 = first(u.2),
            }
        }
        scopes
    }

    fn purge_expired(&mut self, now: Instant, scope: u64) {
        self.map.retain(|_, r| match r.state {
            RefState::Held(_) => r.expires > now,
            _ => r.scope != scope || r.expires > now,
        });
    }

    fn purge_all_expired(&mut self, now: Instant) {
        self.map
            .retain(|_, r| matches!(r.state, RefState::Held(_)) || r.expires > now);
    }

    fn victim(&self, claimer: u64) -> Option<StoreKey> {
        let scopes = self.scopes();
        let own = scopes.get(&claimer).map_or(0, |u| u.0);
        let largest = scopes
            .iter()
            .filter(|(tag, _)| **tag != claimer)
            .max_by_key(|(tag, u)| (u.0, u.2.is_some(), **tag))
            .filter(|(_, u)| u.0 > own)
            .map(|(tag, _)| *tag);
        let oldest_of = |tag: u64| Some(scopes.get(&tag)?.2?.1);
        largest.and_then(oldest_of).or_else(|| oldest_of(claimer))
    }

    fn claim(&mut self, key: StoreKey, token: ClaimToken, lease: Duration) -> Answer {
        let now = Instant::now();
        let scope = key.scope_tag();
        self.purge_expired(now, scope);
        if let Some(r) = self.map.get(&key).copied() {
            if r.expires <= now {
                self.map.remove(&key);
            } else {
                return match r.state {
                    RefState::Held(_) => Answer::Held,
                    RefState::Done(_) => Answer::Completed,
                    RefState::NotReplayable => Answer::NotReplayable,
                };
            }
        }
        if self.map.len() >= self.max_entries {
            self.purge_all_expired(now);
        }
        if self.map.len() >= self.max_entries {
            match self.victim(scope) {
                Some(victim) => {
                    self.map.remove(&victim);
                }
                None => return Answer::Full,
            }
        }
        self.map.insert(
            key,
            RefRecord {
                scope,
                expires: saturating_add(now, lease),
                state: RefState::Held(token),
            },
        );
        Answer::Claimed
    }

    fn owned(&self, key: &StoreKey, token: ClaimToken) -> Option<RefRecord> {
        self.map
            .get(key)
            .copied()
            .filter(|r| r.state == RefState::Held(token))
    }

    fn complete(
        &mut self,
        key: StoreKey,
        token: ClaimToken,
        size: Option<usize>,
        retention: Duration,
    ) -> bool {
        let now = Instant::now();
        self.purge_expired(now, key.scope_tag());
        let Some(record) = self.owned(&key, token) else {
            return false;
        };
        let claimer = record.scope;
        // A record born at its end is never answered: its response takes no room.
        let mut size = size.filter(|size| *size <= self.max_bytes && !retention.is_zero());
        let needed = size.unwrap_or(0);
        if self.bytes() + needed > self.max_bytes {
            self.purge_all_expired(now);
            while self.bytes() + needed > self.max_bytes {
                let scopes = self.scopes();
                let own = scopes.get(&claimer).map_or(0, |u| u.1);
                let payer = scopes
                    .iter()
                    .filter(|(tag, u)| **tag != claimer && u.1 > 0)
                    .max_by_key(|(tag, u)| (u.1, **tag))
                    .filter(|(_, u)| u.1 > own)
                    .map_or(claimer, |(tag, _)| *tag);
                let Some((_, victim)) = scopes.get(&payer).and_then(|u| u.3) else {
                    size = None;
                    break;
                };
                self.map.get_mut(&victim).unwrap().state = RefState::NotReplayable;
            }
        }
        self.map.insert(
            key,
            RefRecord {
                scope: claimer,
                expires: saturating_add(now, retention),
                state: size.map_or(RefState::NotReplayable, RefState::Done),
            },
        );
        true
    }

    fn release(&mut self, key: StoreKey, token: ClaimToken) -> bool {
        self.purge_expired(Instant::now(), key.scope_tag());
        if self.owned(&key, token).is_none() {
            return false;
        }
        self.map.remove(&key);
        true
    }

    fn extend(&mut self, key: StoreKey, token: ClaimToken, lease: Duration) -> bool {
        let now = Instant::now();
        self.purge_expired(now, key.scope_tag());
        if self.owned(&key, token).is_none() {
            return false;
        }
        self.map.get_mut(&key).unwrap().expires = saturating_add(now, lease);
        true
    }
}

fn answer(outcome: Result<ClaimOutcome, StoreError>) -> Answer {
    match outcome {
        Ok(ClaimOutcome::Claimed) => Answer::Claimed,
        Ok(ClaimOutcome::Existing(r)) => match r.state {
            RecordState::InProgress { .. } => Answer::Held,
            RecordState::Completed(_) => Answer::Completed,
            RecordState::NotReplayable => Answer::NotReplayable,
        },
        Err(e) if e.is_full() => Answer::Full,
        Err(e) => panic!("unexpected store error {e:?}"),
    }
}

fn snapshot(store: &MemoryStore) -> BTreeMap<StoreKey, RefRecord> {
    let shard = lock(&store.inner.shards[0]);
    shard
        .map
        .iter()
        .map(|(key, e)| {
            let state = match &e.state {
                State::InProgress { token } => RefState::Held(*token),
                State::Completed { size, .. } => RefState::Done(*size),
                State::NotReplayable => RefState::NotReplayable,
            };
            let record = RefRecord {
                scope: e.scope,
                expires: e.expires_at,
                state,
            };
            (*key, record)
        })
        .collect()
}

struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Runs `steps` random operations on a one-shard store and on the scanning reference, with
/// keys over many scopes (a few large ones, many of one or two records), and asserts after each
/// one that both answered the same and hold exactly the same records in the same states.
async fn differential(
    seed: u64,
    steps: usize,
    scopes: usize,
    max_entries: usize,
    max_bytes: usize,
) {
    const KEYS: usize = 240;
    let names: Vec<Vec<u8>> = (0..scopes)
        .map(|s| format!("tenant-{s}").into_bytes())
        .collect();
    // A quarter of the keys in four large scopes, the rest spread over all of them.
    let scope_of = |i: usize| if i < KEYS / 4 { i % 4 } else { i % scopes };
    let key_of = |i: usize| scoped(i as u32, &names[scope_of(i)]);
    let store = one_shard(max_entries, max_bytes);
    let mut reference = RefShard {
        map: BTreeMap::new(),
        max_entries: store.inner.max_entries_per_shard,
        max_bytes: store.inner.max_bytes_per_shard,
    };
    let mut rng = XorShift(seed);
    let mut tokens: Vec<Option<ClaimToken>> = vec![None; KEYS];
    let mut held: Vec<usize> = Vec::new();
    for step in 0..steps {
        let op = rng.below(40);
        // Completions, releases and extensions mostly of a key claimed lately.
        let i = match held.len() {
            n if n > 0 && op >= 18 && rng.below(5) > 0 => held.swap_remove(rng.below(n)),
            _ => rng.below(KEYS),
        };
        let key = key_of(i);
        let context = format!("seed {seed} scopes {scopes} step {step} op {op} key {i}");
        match op {
            0..=17 => {
                let token = ClaimToken::new();
                let lease = Duration::from_secs([5, 30, 0][rng.below(3)]);
                // Now and then the same digest under another tag.
                let asked = match rng.below(8) {
                    0 => StoreKey::from_bytes(*key.as_bytes()),
                    1 => key.with_scope(&names[rng.below(scopes)]),
                    _ => key,
                };
                let got = answer(store.do_claim(asked, token, FP, lease));
                let want = reference.claim(asked, token, lease);
                assert_eq!(got, want, "{context}: claim");
                if got == Answer::Claimed {
                    tokens[i] = Some(token);
                    held.push(i);
                }
            }
            18..=29 => {
                let token = tokens[i].unwrap_or_else(ClaimToken::new);
                let (completion, size) = match rng.below(6) {
                    0 => (Completion::NotReplayable, None),
                    1 => (response(10), Some(74)),
                    2 => (response(100), Some(164)),
                    3 => (response(300), Some(364)),
                    4 => (response(900), Some(964)),
                    _ => (response(max_bytes), Some(max_bytes + 64)),
                };
                let retention =
                    Duration::from_secs([0, 1, 20, 60, 300, 86_400, 86_400][rng.below(7)]);
                let got = store.do_complete(key, token, completion, retention);
                let want = reference.complete(key, token, size, retention);
                assert_eq!(got, want, "{context}: complete");
            }
            30..=32 => {
                let token = tokens[i].unwrap_or_else(ClaimToken::new);
                let got = store.do_release(key, token);
                assert_eq!(got, reference.release(key, token), "{context}: release");
            }
            33..=35 => {
                let token = tokens[i].unwrap_or_else(ClaimToken::new);
                let lease = Duration::from_secs([5, 30][rng.below(2)]);
                let got = store.do_extend(key, token, lease);
                assert_eq!(
                    got,
                    reference.extend(key, token, lease),
                    "{context}: extend"
                );
            }
            36..=38 => {
                let ms = [0, 1, 200, 999, 1_000][rng.below(5)];
                tokio::time::advance(Duration::from_millis(ms)).await;
            }
            _ => {
                let ms = [5_000, 20_000, 61_000, 301_000][rng.below(4)];
                tokio::time::advance(Duration::from_millis(ms)).await;
            }
        }
        let got = snapshot(&store);
        if got != reference.map {
            let only_store: Vec<_> = got
                .iter()
                .filter(|(k, r)| reference.map.get(k) != Some(r))
                .collect();
            let only_ref: Vec<_> = reference
                .map
                .iter()
                .filter(|(k, r)| got.get(k) != Some(r))
                .collect();
            panic!(
                "{context}: store and reference differ:\n store {only_store:?}\n ref {only_ref:?}"
            );
        }
        check_all(&store, &context);
    }
}

/// HOLDS: with many scopes (up to 120, a few large), every decision of the rankings (expired
/// records first, who pays by entries, whose responses go for bytes, the claimer counted as the
/// largest on a tie, refusal rather than a bystander paying) is exactly the scan's, operation
/// by operation, including leases of zero, retention of zero, tags other than the record's, and
/// time jumps past every retention. (Over its runs, about 2 200 records evicted for entries,
/// 1 500 of them from another scope than the claimer's, 1 000 claims refused, 1 300 responses
/// dropped for bytes.) Fails, among others, when a claimer that holds as much as the largest is
/// not counted as the largest (`>=` for `>` in `victim` or `make_room_for_bytes`), when the
/// tie-break by "has a completed record" is lost, or when a record expiring exactly now is not
/// dropped first.
#[tokio::test(start_paused = true)]
async fn many_scopes_decide_exactly_as_the_scan_did() {
    for seed in 1..=4u64 {
        for (scopes, max_entries, max_bytes) in [(120, 48, 2_000), (40, 24, 1_000), (9, 16, 1_500)]
        {
            let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ scopes as u64;
            differential(seed, 2_000, scopes, max_entries, max_bytes).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The heaps' size and the cost of keeping them.
// ---------------------------------------------------------------------------------------------

/// The shard's scopes and the pairs each heap holds (entries, bytes, expiry).
fn heaps(store: &MemoryStore) -> (usize, [usize; 3]) {
    let shard = lock(&store.inner.shards[0]);
    let lens = [
        shard.by_entries.len(),
        shard.by_bytes.len(),
        shard.by_expiry.len(),
    ];
    (shard.scopes.len(), lens)
}

/// Asserts that no heap holds more than a rebuild allows for `scopes` scopes.
fn assert_bounded(store: &MemoryStore, scopes: usize, context: &str) {
    let (_, lens) = heaps(store);
    for (name, len) in ["entries", "bytes", "expiry"].iter().zip(lens) {
        assert!(
            len <= 2 * scopes + 33,
            "{context}: the {name} heap holds {len} pairs for at most {scopes} scopes"
        );
    }
}

/// HOLDS: the heaps stay within the rebuild bound of the most scopes the shard held, whatever
/// the pattern: thousands of scopes created and removed (claims released), ranks oscillating
/// in place (claim / release storms on two scopes, complete / expire on one), whole
/// generations of scopes expiring at once (time jumps), extension storms. And once the scopes
/// are gone, the next change of rank rebuilds each heap down to what remains. Fails when the
/// rebuild is removed (the heaps grow by one pair per change of rank, without bound).
#[tokio::test(start_paused = true)]
async fn the_heaps_stay_proportional_to_the_scopes_under_churn() {
    // Scopes created and removed: 40 generations of 50 scopes, each claimed then released.
    let store = one_shard(256, 1 << 20);
    for generation in 0..40u32 {
        let keys: Vec<_> = (0..50u32)
            .map(|n| scoped(n, format!("g{generation}-{n}").as_bytes()))
            .collect();
        let tokens: Vec<_> = keys.iter().map(|key| claimed(&store, *key)).collect();
        assert_bounded(&store, 50, "claims of a generation");
        for (key, token) in keys.iter().zip(tokens) {
            assert!(store.do_release(*key, token));
        }
        assert_bounded(&store, 50, "releases of a generation");
    }
    check_all(&store, "after the generations");
    // Nothing pushed since the scopes went: the heaps still hold their pairs. The next change
    // of rank rebuilds the heap it changes.
    let t = claimed(&store, scoped(0, b"last"));
    assert!(store.do_complete(scoped(0, b"last"), t, response(10), DAY));
    assert_bounded(&store, 1, "one scope left");

    // Ranks oscillating: claim / release storms on two scopes, completions expiring in place.
    let store = one_shard(256, 1 << 20);
    let (a, b) = (scoped(1, b"a"), scoped(2, b"b"));
    done(&store, scoped(3, b"a"), 10, DAY);
    for round in 0..5_000u32 {
        let key = if round % 2 == 0 { a } else { b };
        let t = claimed(&store, key);
        if round % 3 == 0 {
            assert!(store.do_complete(key, t, response(10 + round as usize % 50), LEASE));
            tokio::time::advance(LEASE).await;
        } else {
            for _ in 0..3 {
                assert!(store.do_extend(key, t, LEASE));
            }
            assert!(store.do_release(key, t));
        }
        assert_bounded(&store, 2, "oscillating ranks");
    }
    check_all(&store, "after the oscillations");

    // Generations of scopes expiring at once: a full shard, then a time jump past them all,
    // then a new generation makes room from the expired ones.
    let store = one_shard(256, 1 << 20);
    for generation in 0..30u32 {
        for n in 0..256u32 {
            let key = scoped(n, format!("x{generation}-{}", n % 200).as_bytes());
            done(
                &store,
                key,
                10 + n as usize % 7,
                Duration::from_secs(1 + u64::from(n % 3)),
            );
            assert_bounded(&store, 256, "a generation filling the shard");
        }
        tokio::time::advance(Duration::from_secs(4)).await;
    }
    check_all(&store, "after the time jumps");
}

/// The scopes `op` visits one by one (rebuilds of a heap, see `rank::SCOPE_VISITS`).
fn visits_of<T>(op: impl FnOnce() -> T) -> (T, usize) {
    let before = SCOPE_VISITS.with(std::cell::Cell::get);
    let out = op();
    (out, SCOPE_VISITS.with(std::cell::Cell::get) - before)
}

/// HOLDS: rebuilds stay paid for by the changes of rank before them when the scopes shrink and
/// grow back: half of 2 000 scopes released then claimed again, over and over (each time the
/// heaps hold far more pairs than the scopes left), and whole generations expiring at once
/// in a full shard. Fails when a heap is rebuilt as soon as it holds more pairs than scopes
/// (threshold `scopes + 1`): a visit of every scope per operation.
#[tokio::test(start_paused = true)]
async fn shrinking_and_growing_scopes_cost_no_scan_per_operation() {
    const SCOPES: u32 = 2_000;
    let store = one_shard(SCOPES as usize, 1 << 24);
    let keys: Vec<_> = (0..SCOPES)
        .map(|n| scoped(n, format!("tenant-{n}").as_bytes()))
        .collect();
    let mut tokens: Vec<_> = keys.iter().map(|key| claimed(&store, *key)).collect();
    let mut ops = 0;
    let ((), visits) = visits_of(|| {
        for round in 0..6 {
            // Half the scopes go (no pair is pushed for a scope that goes), then come back.
            let half = if round % 2 == 0 {
                0..SCOPES / 2
            } else {
                SCOPES / 2..SCOPES
            };
            for n in half.clone() {
                assert!(store.do_release(keys[n as usize], tokens[n as usize]));
                ops += 1;
            }
            for n in half {
                tokens[n as usize] = claimed(&store, keys[n as usize]);
                ops += 1;
            }
        }
    });
    assert!(
        visits <= 4 * ops,
        "{ops} releases and claims visited {visits} scopes"
    );
    check_all(&store, "after the churn");

    let store = one_shard(SCOPES as usize, 1 << 24);
    let mut ops = 0;
    let mut visits = 0;
    for generation in 0..4u32 {
        let ((), v) = visits_of(|| {
            for n in 0..SCOPES {
                let key = scoped(n, format!("g{generation}-{n}").as_bytes());
                let t = claimed(&store, key);
                assert!(store.do_complete(key, t, response(10), Duration::from_secs(1)));
                ops += 2;
            }
        });
        visits += v;
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    assert!(
        visits <= 4 * ops,
        "{ops} claims and completions visited {visits} scopes"
    );
    check_all(&store, "after the generations");
}

// ---------------------------------------------------------------------------------------------
// Stale pairs and ties.
// ---------------------------------------------------------------------------------------------

/// HOLDS: a scope that held the most, went (its records released or expired: its pairs stay
/// in the heaps, stale) and came back with the same tag holding little is ranked by what it
/// holds now: the scope that holds the most pays, not the one that used to. For entries and for
/// bytes. Fails when a pair is taken as valid because its scope exists (`rank.rs`, `top`).
#[tokio::test(start_paused = true)]
async fn a_scope_gone_and_back_with_the_same_tag_ranks_by_what_it_holds_now() {
    let store = one_shard(8, 10_000);
    // A holds 6 claims (its rank pushed at 1 to 6), then releases them all: A is gone.
    let held: Vec<_> = (0..6u32)
        .map(|n| {
            let key = scoped(n, b"a");
            (key, claimed(&store, key))
        })
        .collect();
    for (key, t) in held {
        assert!(store.do_release(key, t));
    }
    assert_eq!(store.len(), 0);
    // A comes back with one completed record; B holds four, D three: full.
    let a = scoped(10, b"a");
    done(&store, a, 10, DAY);
    let b: Vec<_> = (0..4u32).map(|n| scoped(n, b"b")).collect();
    for key in &b {
        done(&store, *key, 10, DAY);
    }
    for n in 0..3u32 {
        done(&store, scoped(n, b"d"), 10, DAY);
    }
    // C, holding nothing, claims: B, the largest now, pays its oldest.
    claimed(&store, scoped(0, b"c"));
    check_all(&store, "C's claim");
    assert_eq!(peek(&store, a), "completed", "A, holding one, never pays");
    assert_eq!(
        peek(&store, b[0]),
        "absent",
        "B, holding four, paid its oldest"
    );

    // Bytes: A held 1 092 bytes, its records expired; back with 100, it does not pay for D.
    let store = one_shard(16, 1_000);
    for n in 0..3u32 {
        let key = scoped(n, b"a");
        let t = claimed(&store, key);
        assert!(store.do_complete(key, t, response(300), LEASE));
    }
    tokio::time::advance(LEASE).await;
    let a = scoped(10, b"a");
    done(&store, a, 36, DAY);
    let b = scoped(1, b"b");
    done(&store, b, 400, DAY);
    let d = scoped(1, b"d");
    let t = claimed(&store, d);
    assert!(store.do_complete(d, t, response(500), DAY));
    check_all(&store, "after D's response");
    assert_eq!(
        peek(&store, b),
        "not-replayable",
        "B, holding the most bytes, paid"
    );
    assert_eq!(
        peek(&store, a),
        "completed",
        "A, holding 100 bytes now, did not"
    );
    assert_eq!(peek(&store, d), "completed");
}

/// HOLDS: a claimer holding exactly as much as the largest other scope pays with its own
/// records, whichever of the two tags is larger (ties in a heap are broken by the tag): for
/// entries and for bytes, tried with the claimer on each side of the tie. The bystander keeps
/// its record and its response.
#[tokio::test(start_paused = true)]
async fn a_claimer_tied_with_the_largest_pays_itself_on_either_side_of_the_tie() {
    for (claimer, other) in [(&b"x"[..], &b"y"[..]), (b"y", b"x")] {
        // Entries: both hold two completed records; the claimer's third claim evicts its own.
        let store = one_shard(4, 1 << 20);
        let mine: Vec<_> = (0..2u32).map(|n| scoped(n, claimer)).collect();
        let theirs: Vec<_> = (0..2u32).map(|n| scoped(n, other)).collect();
        for (m, t) in mine.iter().zip(&theirs) {
            done(&store, *m, 10, DAY);
            done(&store, *t, 10, DAY);
        }
        claimed(&store, scoped(5, claimer));
        check_all(&store, "the claimer's third claim");
        assert!(theirs.iter().all(|k| peek(&store, *k) == "completed"));
        assert_eq!(
            peek(&store, mine[0]),
            "absent",
            "the claimer paid its oldest"
        );

        // Bytes: both hold 300 bytes; the claimer's new response (200) demotes its own.
        let store = one_shard(16, 700);
        let (m, t) = (scoped(0, claimer), scoped(0, other));
        done(&store, m, 236, DAY);
        done(&store, t, 236, DAY);
        let new = scoped(1, claimer);
        let token = claimed(&store, new);
        assert!(store.do_complete(new, token, response(136), DAY));
        check_all(&store, "the claimer's response");
        assert_eq!(
            peek(&store, t),
            "completed",
            "the bystander kept its response"
        );
        assert_eq!(peek(&store, m), "not-replayable", "the claimer paid");
        assert_eq!(peek(&store, new), "completed");
    }
}

// ---------------------------------------------------------------------------------------------
// A retention of zero.
// ---------------------------------------------------------------------------------------------

/// Was broken (before the rankings too; fixed in `do_complete`): a completion with a retention of zero (the store's
/// API accepts it; the layer refuses it) made room for its response although the record is
/// born at its end and is never answered: another tenant's live response was dropped (its
/// retry then gets 409 instead of its replay) for a response nobody can ever get. Expired
/// records go before a live one pays; this one is expired from the start.
#[tokio::test(start_paused = true)]
async fn a_record_born_at_its_end_costs_no_other_response() {
    let store = one_shard(10, 1_000);
    let b = scoped(1, b"b");
    done(&store, b, 600, DAY);
    let a = scoped(2, b"a");
    let t = claimed(&store, a);
    assert!(store.do_complete(a, t, response(600), Duration::ZERO));
    check_all(&store, "after the completion born expired");
    assert_eq!(peek(&store, a), "absent", "at its end, never answered");
    assert_eq!(
        peek(&store, b),
        "completed",
        "B's live response was dropped for a record born at its end"
    );
    // And the shard's byte count does not hold the expired response either.
    assert_eq!(lock(&store.inner.shards[0]).bytes, 664);
}
