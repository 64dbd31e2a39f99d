//! One cloneable client: a `reqwest::Client` behind the HTTP retry and timeout layers.

use super::error::Error;
use super::pending::Pending;
use super::request::RequestBuilder;
use super::service::ReqwestService;
use super::stack::{Stack, StackResponse};
use crate::classify::{Classify, HttpClassifier};
use crate::hook::OnRetry;
use crate::http::HttpRetryLayer;
use http::Method;
use std::fmt;
use std::time::Duration;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use tower_once_timeout::http::HttpTimeoutLayer;

/// A `reqwest::Client` behind [`HttpRetryLayer`] and a per-attempt [`HttpTimeoutLayer`]: build
/// requests as with reqwest, send them, get a `reqwest::Response` or one [`Error`]. Cloning is
/// cheap and every clone shares the layers' retry budget.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_once_retry::reqwest::Error> {
/// use std::time::Duration;
/// use tower_once_retry::reqwest::Client;
/// use tower_once_retry::RetryLayer;
///
/// let client = Client::builder(reqwest::Client::new())
///     .retry(RetryLayer::new().deadline(Duration::from_secs(10)).into_http().stamp_idempotency_keys(true))
///     .attempt_limit(Duration::from_secs(2))
///     .build();
/// let response = client
///     .post("http://127.0.0.1:3000/charges")
///     .json(&serde_json::json!({ "order_id": "A", "amount": 500 }))
///     .send()
///     .await?; // one Idempotency-Key on every attempt
/// println!("{}", response.status());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    client: reqwest::Client,
    stack: Stack,
}

impl Client {
    /// `client` behind the defaults: [`HttpRetryLayer::new`] (4 attempts, a 30 s deadline over
    /// all of them, the shared retry budget, no key stamping) and a 10 s cap per attempt.
    pub fn new(client: reqwest::Client) -> Self {
        Self::builder(client).build()
    }

    /// A builder over `client`, to choose the retry layer and the per-attempt timeout.
    pub fn builder(client: reqwest::Client) -> ClientBuilder {
        ClientBuilder {
            client,
            retry: HttpRetryLayer::new(),
            attempt_limit: Duration::from_secs(10),
        }
    }

    /// The `reqwest::Client` underneath.
    pub fn get_ref(&self) -> &reqwest::Client {
        &self.client
    }

    /// A request with `method` to `url`.
    pub fn request<U: reqwest::IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder::new(self.stack.clone(), self.client.request(method, url))
    }

    /// A `GET` to `url`.
    pub fn get<U: reqwest::IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// A `POST` to `url`.
    pub fn post<U: reqwest::IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// A `PUT` to `url`.
    pub fn put<U: reqwest::IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// A `PATCH` to `url`.
    pub fn patch<U: reqwest::IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// A `DELETE` to `url`.
    pub fn delete<U: reqwest::IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// A `HEAD` to `url`.
    pub fn head<U: reqwest::IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::HEAD, url)
    }

    /// Sends a request built elsewhere.
    pub fn execute(&self, request: reqwest::Request) -> Pending {
        match http::Request::<reqwest::Body>::try_from(request) {
            Ok(request) => self.send(request),
            Err(error) => Pending::failed(Error::build(error)),
        }
    }

    fn send(&self, request: http::Request<reqwest::Body>) -> Pending {
        Pending::sending(self.stack.clone().oneshot(request))
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Client`]: see [`Client::builder`].
pub struct ClientBuilder<C = HttpClassifier, H = ()> {
    client: reqwest::Client,
    retry: HttpRetryLayer<C, H>,
    attempt_limit: Duration,
}

impl<C, H> ClientBuilder<C, H> {
    /// The retry layer, with every setting of its own (attempts, deadline, budget, classifier,
    /// key stamping). Default [`HttpRetryLayer::new`].
    pub fn retry<C2, H2>(self, retry: HttpRetryLayer<C2, H2>) -> ClientBuilder<C2, H2> {
        ClientBuilder {
            client: self.client,
            retry,
            attempt_limit: self.attempt_limit,
        }
    }

    /// The cap on each attempt (the time left before the deadline caps it too). Default 10 s.
    pub fn attempt_limit(mut self, timeout: Duration) -> Self {
        self.attempt_limit = timeout;
        self
    }

    /// The client.
    pub fn build(self) -> Client
    where
        C: Classify<StackResponse, tower_once_timeout::TimeoutError<reqwest::Error>>
            + Clone
            + Send
            + Sync
            + 'static,
        H: OnRetry<StackResponse, tower_once_timeout::TimeoutError<reqwest::Error>>
            + Clone
            + Send
            + Sync
            + 'static,
    {
        let transport = HttpTimeoutLayer::new(self.attempt_limit)
            .layer(ReqwestService::new(self.client.clone()));
        let stack = self.retry.layer(transport);
        Client {
            client: self.client,
            stack: BoxCloneSyncService::new(stack),
        }
    }
}

impl<C, H> fmt::Debug for ClientBuilder<C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("client", &self.client)
            .field("attempt_limit", &self.attempt_limit)
            .finish_non_exhaustive()
    }
}
