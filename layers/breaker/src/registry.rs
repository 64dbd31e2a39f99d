//! The circuits of one layer: its default circuit, and at most `max_circuits` keyed ones; and
//! what each service and future holds of its layer ([`Config`]: the key, the classifier, the
//! registry).
//!
//! Each thread looks keys up in a cache of its own (one of eight, as the retry budget's
//! shards), so a hot key read by every core contends for no lock: the read lock it takes is on
//! a line only its thread uses. A miss takes the layer's one mutex, which also adds the circuit
//! to that thread's cache, so an evicted circuit never comes back through a cache.
//!
//! When the bound is reached, a new key evicts an idle circuit (closed, no failure counted, no
//! call through it lately: forgetting it loses nothing), looking at up to eight of the oldest;
//! an open or failing circuit, or one with calls under way, is never evicted, so a stream of
//! hostile keys cannot reset a sick endpoint's breaker. When none of them is idle, the new key
//! shares one overflow circuit.

use crate::circuit::Circuit;
use crate::config::Policy;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use tokio::time::Instant;
use tower_once_core::shard::{index, Padded, PerThread, SHARDS};

/// The name of the circuit new keys share when the bound is reached and no circuit is idle.
pub(crate) const OVERFLOW: &str = "(overflow)";

/// How many of the oldest circuits a new key looks at for one to evict.
const EVICTION_TRIES: usize = 8;

type Cache = HashMap<Arc<str>, PerThread<Circuit>>;

#[derive(Debug)]
pub(crate) struct Registry {
    policy: Arc<Policy>,
    default: PerThread<Circuit>,
    overflow: PerThread<Circuit>,
    global: Mutex<Global>,
    caches: [Padded<RwLock<Cache>>; SHARDS],
}

#[derive(Debug, Default)]
struct Global {
    map: Cache,
    // Oldest first: where eviction looks.
    order: VecDeque<Arc<str>>,
}

impl Registry {
    pub(crate) fn new(policy: Policy) -> Self {
        let policy = Arc::new(policy);
        let circuit = |name: &str| PerThread::new(Circuit::new(Arc::from(name), policy.clone()));
        Self {
            default: circuit(""),
            overflow: circuit(OVERFLOW),
            policy,
            global: Mutex::default(),
            caches: Default::default(),
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The circuit of requests without a key of their own.
    pub(crate) fn default_circuit(&self) -> &PerThread<Circuit> {
        &self.default
    }

    /// The circuit named `name`, made if need be: this thread's copy.
    #[inline]
    pub(crate) fn lookup(&self, name: &str) -> Arc<Padded<Circuit>> {
        let cache = &self.caches[index()].0;
        let found = cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .map(PerThread::local);
        let circuit = match found {
            Some(circuit) => circuit,
            None => self.lookup_slow(name, cache, false).local(),
        };
        circuit.0.touch(Instant::now());
        circuit
    }

    /// `by_hand`: made for a person steering it, who gets the circuit of that key even past
    /// the bound (the bound is against keys that requests bring).
    #[cold]
    fn lookup_slow(&self, name: &str, cache: &RwLock<Cache>, by_hand: bool) -> PerThread<Circuit> {
        let mut global = self.global.lock().unwrap_or_else(PoisonError::into_inner);
        let (key, circuit) = match global.map.get_key_value(name) {
            Some((key, circuit)) => (key.clone(), circuit.clone()),
            None => match self.make_room(&mut global) || by_hand {
                false => return self.overflow.clone(),
                true => {
                    let key: Arc<str> = Arc::from(name);
                    let circuit = PerThread::new(Circuit::new(key.clone(), self.policy.clone()));
                    global.map.insert(key.clone(), circuit.clone());
                    global.order.push_back(key.clone());
                    crate::metrics::circuits(global.map.len());
                    (key, circuit)
                }
            },
        };
        // NOTE: added under the global lock, so that an eviction (which holds it too) never
        // leaves this circuit in a cache after removing it from the map.
        cache
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, circuit.clone());
        drop(global);
        circuit
    }

    /// Whether there is room for one more keyed circuit, evicting an idle one if need be.
    fn make_room(&self, global: &mut Global) -> bool {
        if global.map.len() < self.policy.max_circuits {
            return true;
        }
        let now = Instant::now();
        for _ in 0..EVICTION_TRIES.min(global.order.len()) {
            let Some(oldest) = global.order.pop_front() else {
                break;
            };
            let idle = global
                .map
                .get(&oldest)
                .is_none_or(|circuit| circuit.get().is_idle(now));
            if !idle {
                global.order.push_back(oldest);
                continue;
            }
            global.map.remove(&oldest);
            for cache in &self.caches {
                cache
                    .0
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&oldest);
            }
            tracing::debug!(circuit = &*oldest, "idle circuit evicted for a new key");
            return true;
        }
        tracing::debug!(
            "circuit bound reached and none idle: the new key shares the overflow circuit"
        );
        false
    }

    /// The circuit named `name` (`""`: the default one), made if need be, even past the bound.
    pub(crate) fn circuit(&self, name: &str) -> Circuit {
        if name.is_empty() {
            return self.default.get().clone();
        }
        let cache = &self.caches[index()].0;
        let circuit = self.lookup_slow(name, cache, true).get().clone();
        circuit.touch(Instant::now());
        circuit
    }

    /// The circuit keys share when the bound is reached and no circuit is idle.
    pub(crate) fn overflow(&self) -> Circuit {
        self.overflow.get().clone()
    }

    /// Whether `circuit` is the one keys share at the bound.
    pub(crate) fn is_overflow(&self, circuit: &Circuit) -> bool {
        circuit.same_as(self.overflow.get())
    }

    /// The circuit named `name` if there is one.
    pub(crate) fn find(&self, name: &str) -> Option<Circuit> {
        if name.is_empty() {
            return Some(self.default.get().clone());
        }
        let global = self.global.lock().unwrap_or_else(PoisonError::into_inner);
        global.map.get(name).map(|circuit| circuit.get().clone())
    }

    /// Every circuit: the default one, the keyed ones, and the overflow one.
    pub(crate) fn all(&self) -> Vec<Circuit> {
        let global = self.global.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all = Vec::with_capacity(global.map.len() + 2);
        all.push(self.default.get().clone());
        all.extend(global.map.values().map(|c| c.get().clone()));
        all.push(self.overflow.get().clone());
        all
    }
}

/// What a service and its futures hold of their layer: its thread's copy (see
/// [`PerThread`]).
pub(crate) struct Config<K, C> {
    pub(crate) key: K,
    pub(crate) classifier: C,
    pub(crate) registry: Arc<Registry>,
}

impl<K: Clone, C: Clone> Clone for Config<K, C> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            classifier: self.classifier.clone(),
            registry: self.registry.clone(),
        }
    }
}

impl<K, C> fmt::Debug for Config<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("key", &std::any::type_name::<K>())
            .field("classifier", &std::any::type_name::<C>())
            .finish_non_exhaustive()
    }
}
