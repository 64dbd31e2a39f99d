//! A step's identity: (run, step, tool, occurrence), and the keys derived from it.

use sha2::{Digest, Sha256};
use std::fmt;
use tower_once_idempotency::store::StoreKey;

/// The longest run id or tool name a step accepts, in bytes. Longer ones are refused
/// ([`StepError::is_invalid`](crate::StepError::is_invalid)): they are hashed, so length
/// costs nothing in the store, but an id that long is a bug or an attack.
pub const MAX_ID_LEN: usize = 1024;

/// Who a step is: the run it belongs to, its position in the run, the tool it calls, and
/// which call of that tool within the step (for a tool called twice in one step).
///
/// It must come from the caller's logic, never from randomness or the clock, so that the same
/// step gets the same id on every retry, after a restart and in another process (Temporal's run
/// id + activity id, Vercel Workflow's `stepId`).
///
/// ```
/// use tower_once_step::StepId;
///
/// let refund = StepId::new("run-3", 2, "refund");
/// assert_eq!(refund.idempotency_key(), StepId::new("run-3", 2, "refund").idempotency_key());
/// assert_ne!(refund.idempotency_key(), refund.clone().occurrence(1).idempotency_key());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StepId {
    run: String,
    step: u32,
    tool: String,
    occurrence: u32,
}

impl StepId {
    /// The first call of `tool` at position `step` of `run`.
    pub fn new(run: impl Into<String>, step: u32, tool: impl Into<String>) -> Self {
        Self {
            run: run.into(),
            step,
            tool: tool.into(),
            occurrence: 0,
        }
    }

    /// The `n`th call (from 0) of the same tool within the same step.
    pub fn occurrence(mut self, n: u32) -> Self {
        self.occurrence = n;
        self
    }

    /// The run.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The position in the run.
    pub fn step(&self) -> u32 {
        self.step
    }

    /// The tool.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// Which call of the tool within the step (0 for the first).
    pub fn occurrence_number(&self) -> u32 {
        self.occurrence
    }

    /// The `Idempotency-Key` this step sends downstream when it is keyed: `step-` and 32 hex
    /// digits of a hash of the id, the same in every process and after every restart, and
    /// different for every (run, step, tool, occurrence).
    pub fn idempotency_key(&self) -> String {
        hex_key(&self.digest(b"tower-once/step-key/v1"))
    }

    /// [`idempotency_key`](Self::idempotency_key) within a tenant's scope.
    pub(crate) fn scoped_idempotency_key(&self, scope: &[u8]) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"tower-once/step-key/v1/scoped");
        framed(&mut hasher, scope);
        self.feed(&mut hasher);
        hex_key(&hasher.finalize().into())
    }

    pub(crate) fn is_valid(&self) -> bool {
        self.run.len() <= MAX_ID_LEN && self.tool.len() <= MAX_ID_LEN
    }

    /// The key of the step's record, within `scope`.
    pub(crate) fn store_key(&self, scope: &[u8]) -> StoreKey {
        self.scoped(b"tower-once/step/v1", scope)
    }

    /// The key of the step's "sent" marker, within `scope`.
    pub(crate) fn marker_key(&self, scope: &[u8]) -> StoreKey {
        self.scoped(b"tower-once/step-sent/v1", scope)
    }

    /// One SHA-256 over the domain, the scope and the id: collision-resistant, since a scope
    /// is a tenant and a run id may be a client's.
    fn scoped(&self, domain: &[u8], scope: &[u8]) -> StoreKey {
        let mut hasher = Sha256::new();
        hasher.update(domain);
        framed(&mut hasher, scope);
        self.feed(&mut hasher);
        StoreKey::from_bytes(hasher.finalize().into()).with_scope(scope)
    }

    fn digest(&self, domain: &[u8]) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(domain);
        self.feed(&mut hasher);
        hasher.finalize().into()
    }

    fn feed(&self, hasher: &mut Sha256) {
        framed(hasher, self.run.as_bytes());
        hasher.update(self.step.to_be_bytes());
        framed(hasher, self.tool.as_bytes());
        hasher.update(self.occurrence.to_be_bytes());
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `step-` and the first 16 bytes of `digest` in hex.
fn hex_key(digest: &[u8; 32]) -> String {
    let mut key = String::with_capacity(5 + 32);
    key.push_str("step-");
    for byte in &digest[..16] {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    key
}

/// Length-prefixed, so that ("ab", "c") and ("a", "bc") never hash alike.
fn framed(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

impl fmt::Debug for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepId")
            .field("run", &self.run)
            .field("step", &self.step)
            .field("tool", &self.tool)
            .field("occurrence", &self.occurrence)
            .finish()
    }
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.run, self.step, self.tool)?;
        if self.occurrence > 0 {
            write!(f, "#{}", self.occurrence)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_keeps_fields_apart() {
        let a = StepId::new("ab", 1, "c");
        let b = StepId::new("a", 1, "bc");
        assert_ne!(a.idempotency_key(), b.idempotency_key());
        assert_ne!(a.store_key(b""), b.store_key(b""));
    }

    #[test]
    fn scopes_and_markers_never_share_keys() {
        let id = StepId::new("run-1", 2, "refund");
        assert_ne!(id.store_key(b"a"), id.store_key(b"b"));
        assert_ne!(id.store_key(b""), id.marker_key(b""));
    }

    #[test]
    fn the_key_is_pinned() {
        // Stored records and downstream keys outlive a release: the derivation must not drift.
        let key = StepId::new("run-0", 2, "refund").idempotency_key();
        assert_eq!(key.len(), 37);
        assert!(key.starts_with("step-"));
        assert_eq!(key, "step-527489511915a9d464284db91b5f6805");
    }
}
