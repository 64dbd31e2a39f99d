//! Which circuit a request goes through.
//!
//! One dependency, one circuit: a client that talks to several hosts needs one circuit per
//! host, or one sick host opens the circuit for all of them (Microsoft's resilience handler
//! keys by authority, seatbelt by a `breaker_id`). A [`CircuitKey`] names the circuit of each
//! request; the layer keeps at most [`max_circuits`](crate::CircuitBreakerLayer::max_circuits)
//! of them. Past the bound, a new key evicts an idle circuit (closed, no failure counted, no
//! call through it for a minute, or its window when longer), and shares one overflow circuit
//! when none is idle: a stream of hostile keys cannot grow memory, nor evict (and so reset) a
//! circuit that is failing or has calls under way. Circuits made by hand
//! ([`Circuits::circuit`](crate::Circuits::circuit)) are always their key's own.
//!
//! | key | circuits |
//! |---|---|
//! | `()` (the default of [`CircuitBreakerLayer::new`](crate::CircuitBreakerLayer::new)) | one for the layer |
//! | [`Authority`] (the default of [`CircuitBreakerLayer::http`](crate::CircuitBreakerLayer::http)) | one per scheme and authority (`https://api.example.com:443`); a request without an authority goes through the default one |
//! | a closure `Fn(&Req) -> Option<K>`, `K: AsRef<str>` | one per key; `None` goes through the default one |
//!
//! ```
//! use tower_once_breaker::CircuitBreakerLayer;
//!
//! // One circuit per LLM model a request names in a header.
//! let layer = CircuitBreakerLayer::new().key_by(|req: &http::Request<String>| {
//!     req.headers().get("x-model").and_then(|v| v.to_str().ok()).map(str::to_owned)
//! });
//! # let _ = layer;
//! ```

/// Names the circuit of a request. See the [module docs](self).
pub trait CircuitKey<Req> {
    /// Whether requests may go through circuits of their own (`false` only for `()`, which
    /// spares the layer any lookup).
    const KEYED: bool = true;

    /// Writes the name of `req`'s circuit into `name` (empty on entry). Leaving it empty sends
    /// the request through the layer's default circuit.
    fn key(&self, req: &Req, name: &mut String);
}

impl<Req> CircuitKey<Req> for () {
    const KEYED: bool = false;

    fn key(&self, _: &Req, _: &mut String) {}
}

impl<F, Req, K> CircuitKey<Req> for F
where
    F: Fn(&Req) -> Option<K>,
    K: AsRef<str>,
{
    fn key(&self, req: &Req, name: &mut String) {
        if let Some(key) = self(req) {
            name.push_str(key.as_ref());
        }
    }
}

/// One circuit per scheme, host and port of an `http::Request`'s URI, lowercased
/// (`https://api.example.com`; a user and password in the URI are left out): the default of
/// [`CircuitBreakerLayer::http`](crate::CircuitBreakerLayer::http).
///
/// ```
/// use tower_once_breaker::key::{Authority, CircuitKey};
///
/// let req = http::Request::get("HTTPS://API.Example.com/v1/messages").body(()).unwrap();
/// let mut name = String::new();
/// Authority.key(&req, &mut name);
/// assert_eq!(name, "https://api.example.com");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Authority;

impl<B> CircuitKey<http::Request<B>> for Authority {
    fn key(&self, req: &http::Request<B>, name: &mut String) {
        let uri = req.uri();
        let Some(authority) = uri.authority() else {
            return;
        };
        if let Some(scheme) = uri.scheme_str() {
            name.push_str(scheme);
            name.push_str("://");
        }
        // Host and port only: a user and password in the URI never reach a circuit's name
        // (which logs and metrics show).
        name.push_str(authority.host());
        if let Some(port) = authority.port() {
            name.push(':');
            name.push_str(port.as_str());
        }
        name.make_ascii_lowercase();
    }
}
