//! A call made as a step: the request, its step id, its arguments and what to do when an
//! earlier attempt's outcome is unknown.

use crate::id::StepId;
use tower_once_core::deadline::Deadline;
use tower_once_idempotency::fingerprint::Fingerprint;
use xxhash_rust::xxh3::xxh3_128;

/// What a step does when an earlier attempt of it was sent and never recorded (its call timed
/// out, its process was killed): the call may or may not have had its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnknown {
    /// Send it again. Right for a call that is idempotent or carries its key downstream
    /// ([`Step::keyed`]): the second send has the effect of the first.
    RunAgain,
    /// Never send it again blindly: the layer's [`verify`](crate::StepLayer::verify) hook is
    /// asked whether it happened (found: its result is recorded; not found: it is sent); without
    /// a hook, or when the hook cannot tell, the step fails with an unknown-outcome error
    /// ([`StepError::is_unknown`](crate::StepError::is_unknown)), recorded so every later
    /// attempt gets the same answer. For a tool that cannot be made safe.
    Refuse,
}

/// A request type a step can carry: whether it may be sent twice, and how it carries a key.
///
/// `http::Request` implements it: an idempotent method, an `Idempotency-Key` header or
/// [`SafeToRetry`](tower_once_core::resend::SafeToRetry) may be sent twice, and
/// [`Step::keyed`] stamps the step's key as `Idempotency-Key`. For a request type of your own,
/// `impl StepRequest for MyCall {}` says "never sent twice unless the step says so".
pub trait StepRequest {
    /// Whether sending it twice has the effect of once (the default policy, when a step sets
    /// none, runs it again only then).
    fn may_send_twice(&self) -> bool {
        false
    }

    /// The key it already carries downstream, if any (a non-empty `Idempotency-Key` header).
    fn carried_key(&self) -> Option<String> {
        None
    }

    /// Whether it can carry a key downstream ([`carry_key`](Self::carry_key)).
    fn can_carry_key(&self) -> bool {
        false
    }

    /// Carries `key` downstream (as `Idempotency-Key` for HTTP), replacing no key already
    /// there (an empty one is none). Returns whether the request now carries a key.
    fn carry_key(&mut self, key: &str) -> bool {
        let _ = key;
        false
    }

    /// The deadline the request carries, if any: waiting for the step elsewhere stops there.
    fn deadline(&self) -> Option<Deadline> {
        None
    }

    /// The extensions that travel with the request, if it has any (a deadline attached with
    /// [`Deadline::call`] on the step lands there).
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }

    /// Where the step puts its [`Claim`](tower_once_idempotency::Claim) on a store whose
    /// records a tool can commit in its own transaction (Postgres), if the request has
    /// extensions.
    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        None
    }
}

impl<B> StepRequest for http::Request<B> {
    fn may_send_twice(&self) -> bool {
        // An empty `Idempotency-Key` is no key: a downstream cannot dedupe by it.
        tower_once_core::resend::is_idempotent(self.method())
            || self.carried_key().is_some()
            || self
                .extensions()
                .get::<tower_once_core::resend::SafeToRetry>()
                .is_some()
    }

    fn carried_key(&self) -> Option<String> {
        let key = self.headers().get(tower_once_core::IDEMPOTENCY_KEY)?;
        let key = key.to_str().ok()?.trim();
        (!key.is_empty()).then(|| key.to_owned())
    }

    fn can_carry_key(&self) -> bool {
        true
    }

    fn carry_key(&mut self, key: &str) -> bool {
        if self.carried_key().is_some() {
            return true;
        }
        match http::HeaderValue::from_str(key) {
            Ok(value) => {
                self.headers_mut()
                    .insert(tower_once_core::IDEMPOTENCY_KEY, value);
                true
            }
            Err(_) => false,
        }
    }

    fn deadline(&self) -> Option<Deadline> {
        Deadline::of(self)
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(http::Request::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(http::Request::extensions_mut(self))
    }
}

/// A request made as a step of a run. See the [crate docs](crate).
///
/// ```
/// use tower_once_step::{OnUnknown, Step, StepId};
///
/// let body = serde_json::json!({ "run": "run-3", "amount": 40 });
/// let request = http::Request::post("http://payments/refunds")
///     .body(body.to_string())
///     .unwrap();
/// let step = Step::new(StepId::new("run-3", 2, "refund"), request)
///     .arguments(body.to_string())
///     .keyed(); // Idempotency-Key: step-…, the same after a restart: safe to send again
/// assert_eq!(step.idempotency_key(), StepId::new("run-3", 2, "refund").idempotency_key());
/// assert_eq!(step.on_unknown_policy(), OnUnknown::RunAgain);
/// ```
#[derive(Debug, Clone)]
pub struct Step<Req> {
    pub(crate) id: StepId,
    pub(crate) request: Req,
    pub(crate) arguments: Fingerprint,
    pub(crate) on_unknown: Option<OnUnknown>,
    pub(crate) scope: Option<Vec<u8>>,
    pub(crate) keyed: bool,
}

impl<Req> Step<Req> {
    /// `request` as the step `id`, with no arguments recorded (see [`arguments`](Self::arguments)).
    pub fn new(id: StepId, request: Req) -> Self {
        Self {
            id,
            request,
            arguments: Fingerprint::from_bytes([0; 32]),
            on_unknown: None,
            scope: None,
            keyed: false,
        }
    }

    /// The call's arguments, as bytes (a JSON body, say). A step recorded with other arguments
    /// is a mismatch ([`StepError::is_mismatch`](crate::StepError::is_mismatch)) and nothing is
    /// sent: the code that made the call changed between two runs of it. They are hashed
    /// (xxh3-128), not stored.
    pub fn arguments(mut self, arguments: impl AsRef<[u8]>) -> Self {
        self.arguments = fingerprint(arguments.as_ref());
        self
    }

    /// The call's arguments as JSON (any `serde::Serialize`), hashed as
    /// [`arguments`](Self::arguments) does. A value that does not serialize is an error.
    pub fn arguments_json<T: serde::Serialize + ?Sized>(
        self,
        arguments: &T,
    ) -> Result<Self, serde_json::Error> {
        let bytes = serde_json::to_vec(arguments)?;
        Ok(self.arguments(bytes))
    }

    /// What to do when an earlier attempt's outcome is unknown. Without it: run again when the
    /// step is [`keyed`](Self::keyed) or its request may be sent twice
    /// ([`StepRequest::may_send_twice`]: idempotent, or carrying a key of its own), refuse
    /// otherwise.
    pub fn on_unknown(mut self, policy: OnUnknown) -> Self {
        self.on_unknown = Some(policy);
        self
    }

    /// The tenant (or principal) the step belongs to: steps of two scopes never share a
    /// record. Required when the layer is [`scoped`](crate::StepLayer::scoped).
    pub fn scope(mut self, scope: impl AsRef<[u8]>) -> Self {
        self.scope = Some(scope.as_ref().to_vec());
        self
    }

    /// The step id.
    pub fn id(&self) -> &StepId {
        &self.id
    }

    /// The request.
    pub fn request(&self) -> &Req {
        &self.request
    }

    /// The request, mutably.
    pub fn request_mut(&mut self) -> &mut Req {
        &mut self.request
    }
}

impl<Req: StepRequest> Step<Req> {
    /// Carries the step's key downstream ([`idempotency_key`](Self::idempotency_key), as
    /// `Idempotency-Key` for HTTP, stamped when the step is called), so a second send is
    /// answered by the first one's effect, and makes the policy [`OnUnknown::RunAgain`]. A
    /// request that already carries a key keeps it; a request type that cannot carry one keeps
    /// the policy its request implies.
    pub fn keyed(mut self) -> Self {
        self.keyed = true;
        self
    }

    /// The key the step's call carries downstream: the request's own (a non-empty
    /// `Idempotency-Key` it was built with), or the one [`keyed`](Self::keyed) stamps, derived
    /// from the step id and its scope ([`StepId::idempotency_key`] when it has none), so two
    /// tenants' steps named alike never share one. An unknown outcome names it.
    pub fn idempotency_key(&self) -> String {
        self.request
            .carried_key()
            .unwrap_or_else(|| derived_key(&self.id, self.scope.as_deref().unwrap_or_default()))
    }

    /// The policy this step follows: set with [`on_unknown`](Self::on_unknown), or
    /// [`OnUnknown::RunAgain`] when it is keyed (and its request can carry a key) or its
    /// request may be sent twice, [`OnUnknown::Refuse`] otherwise.
    pub fn on_unknown_policy(&self) -> OnUnknown {
        let keyed = self.keyed && self.request.can_carry_key();
        self.on_unknown
            .unwrap_or(if keyed || self.request.may_send_twice() {
                OnUnknown::RunAgain
            } else {
                OnUnknown::Refuse
            })
    }
}

impl<Req: StepRequest> tower_once_core::carrier::Carrier for Step<Req> {
    fn extensions(&self) -> Option<&http::Extensions> {
        self.request.extensions()
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        self.request.extensions_mut()
    }
}

/// The key a keyed step stamps: from the id, and the scope when there is one.
pub(crate) fn derived_key(id: &StepId, scope: &[u8]) -> String {
    if scope.is_empty() {
        id.idempotency_key()
    } else {
        id.scoped_idempotency_key(scope)
    }
}

/// The arguments' fingerprint: a tag, so a step's records never read as another kind's, and
/// xxh3-128 of the bytes.
fn fingerprint(bytes: &[u8]) -> Fingerprint {
    let mut out = [0; 32];
    out[..16].copy_from_slice(b"tower-once step\x01");
    out[16..].copy_from_slice(&xxh3_128(bytes).to_be_bytes());
    Fingerprint::from_bytes(out)
}
