//! The store contract's rules, one check each (see [`Suite::run`]).

use super::{fingerprint, ok, random_key, Clock, Suite};
use crate::store::{
    ClaimOutcome, ClaimToken, Completion, IdempotencyStore, RecordState, StoredResponse,
};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

impl<St: IdempotencyStore, C: Clock> Suite<St, C> {
    /// Rule 1: a claimed key is held; a second claim sees it in progress, with its fingerprint.
    pub async fn claim_is_exclusive(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        assert!(matches!(
            self.claim(key, token, fingerprint(1)).await,
            ClaimOutcome::Claimed
        ));
        match self.claim(key, ClaimToken::new(), fingerprint(2)).await {
            ClaimOutcome::Existing(record) => {
                assert_eq!(
                    record.fingerprint,
                    fingerprint(1),
                    "the first claim's fingerprint"
                );
                match record.state {
                    RecordState::InProgress { lease_remaining } => {
                        assert!(
                            lease_remaining <= self.lease,
                            "lease_remaining within the lease"
                        )
                    }
                    other => panic!("a claimed key must be in progress, got {other:?}"),
                }
            }
            ClaimOutcome::Claimed => panic!("a held key was claimed twice"),
        }
    }

    /// Rule 1: of many concurrent claims of one key, exactly one wins.
    pub async fn concurrent_claims_have_one_winner(&self) {
        let key = random_key();
        let tasks: Vec<_> = (0..self.concurrency)
            .map(|_| {
                let store = self.store.clone();
                let lease = self.lease;
                tokio::spawn(async move {
                    store
                        .claim(key, ClaimToken::new(), fingerprint(1), lease)
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await {
                Ok(Ok(ClaimOutcome::Claimed)) => winners += 1,
                Ok(Ok(ClaimOutcome::Existing(_))) => {}
                Ok(Err(e)) => panic!("claim failed: {e}"),
                Err(e) => panic!("claim task failed: {e}"),
            }
        }
        assert_eq!(winners, 1, "exactly one concurrent claim wins");
    }

    /// Rule 3: status, repeated headers in order, binary body and trailers come back unchanged.
    pub async fn complete_round_trips_the_response(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        assert!(matches!(
            self.claim(key, token, fingerprint(3)).await,
            ClaimOutcome::Claimed
        ));
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert(
            "x-binary",
            HeaderValue::from_bytes(&[0x80, 0xff, b'a'])
                .unwrap_or_else(|_| HeaderValue::from_static("x")),
        );
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body: Bytes = (0..=255u8)
            .cycle()
            .take(256 * 1024 + 7)
            .collect::<Vec<_>>()
            .into();
        let stored =
            StoredResponse::new(StatusCode::ACCEPTED, headers, body).with_trailers(trailers);

        let completion = Completion::Response(stored.clone());
        assert!(ok(self
            .store
            .complete(key, token, completion, self.retention)
            .await));
        match self.state(key).await {
            Some((fp, RecordState::Completed(back))) => {
                assert_eq!(fp, fingerprint(3), "the fingerprint survives completion");
                assert_eq!(back.status, stored.status);
                assert_eq!(back.headers, stored.headers);
                assert_eq!(
                    back.headers
                        .get_all("set-cookie")
                        .iter()
                        .collect::<Vec<_>>(),
                    ["a=1", "b=2"],
                    "repeated headers keep their order"
                );
                assert_eq!(back.body, stored.body, "the body round-trips byte for byte");
                assert_eq!(back.trailers, stored.trailers);
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
    }

    /// Rule 3: a not-replayable completion holds the key without a response.
    pub async fn not_replayable_is_kept(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(4)).await;
        let done = self
            .store
            .complete(key, token, Completion::NotReplayable, self.retention);
        assert!(ok(done.await));
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::NotReplayable))
        ));
    }

    /// Rule 2: complete, release and extend with another token change nothing.
    pub async fn writes_are_fenced_by_token(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(5)).await;
        let other = ClaimToken::new();
        let response = Completion::Response(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"stolen"),
        ));
        assert!(!ok(self
            .store
            .complete(key, other, response, self.retention)
            .await));
        assert!(!ok(self.store.release(key, other).await));
        assert!(!ok(self.store.extend(key, other, self.lease).await));
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        // Operations on a key nobody holds are refused too.
        let absent = random_key();
        assert!(!ok(self.store.release(absent, token).await));
        assert!(!ok(self.store.extend(absent, token, self.lease).await));
        let completion = Completion::NotReplayable;
        assert!(!ok(self
            .store
            .complete(absent, token, completion, self.retention)
            .await));
        assert!(
            self.state(absent).await.is_none(),
            "a refused complete must not create a record"
        );
    }

    /// Rule 2: the owner itself cannot release, extend or re-complete a completed record.
    pub async fn completed_records_cannot_be_released_or_extended(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(6)).await;
        let first = Completion::Response(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"first"),
        ));
        assert!(ok(self
            .store
            .complete(key, token, first, self.retention)
            .await));
        assert!(!ok(self.store.release(key, token).await));
        assert!(!ok(self.store.extend(key, token, self.lease).await));
        let second = Completion::Response(StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"second"),
        ));
        assert!(!ok(self
            .store
            .complete(key, token, second, self.retention)
            .await));
        match self.state(key).await {
            Some((_, RecordState::Completed(r))) => assert_eq!(r.body, "first"),
            other => panic!("expected the first completion, got {other:?}"),
        }
    }

    /// A released key can be claimed again.
    pub async fn release_frees_the_key(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(7)).await;
        assert!(ok(self.store.release(key, token).await));
        assert!(
            !ok(self.store.release(key, token).await),
            "a second release finds nothing"
        );
        assert!(matches!(
            self.claim(key, ClaimToken::new(), fingerprint(8)).await,
            ClaimOutcome::Claimed
        ));
    }

    /// Rule 4: an extended lease outlives the original one.
    pub async fn extend_renews_the_lease(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(9)).await;
        self.clock.advance(self.lease * 3 / 5).await;
        assert!(ok(self.store.extend(key, token, self.lease).await));
        self.clock.advance(self.lease * 3 / 5).await;
        // 1.2 leases after the claim, 0.6 after the renewal: still held.
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        assert!(ok(self.store.release(key, token).await));
    }

    /// Rule 4 and 2: a lapsed lease frees the key; the old owner can no longer write.
    pub async fn lease_expiry_frees_the_key_and_fences_the_old_owner(&self) {
        let (key, old) = (random_key(), ClaimToken::new());
        self.claim(key, old, fingerprint(10)).await;
        self.clock.advance(self.lease + self.lease / 2).await;
        let new = ClaimToken::new();
        assert!(
            matches!(
                self.claim(key, new, fingerprint(10)).await,
                ClaimOutcome::Claimed
            ),
            "a key whose lease lapsed is free"
        );
        let stale = Completion::NotReplayable;
        assert!(!ok(self
            .store
            .complete(key, old, stale, self.retention)
            .await));
        assert!(!ok(self.store.release(key, old).await));
        assert!(matches!(
            self.state(key).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        assert!(ok(self.store.release(key, new).await));
    }

    /// Rule 4: a completed record disappears after its retention.
    pub async fn retention_expiry_frees_the_key(&self) {
        let (key, token) = (random_key(), ClaimToken::new());
        self.claim(key, token, fingerprint(11)).await;
        let retention = self.lease;
        let done = self
            .store
            .complete(key, token, Completion::NotReplayable, retention);
        assert!(ok(done.await));
        self.clock.advance(retention / 2).await;
        assert!(self.state(key).await.is_some(), "kept within its retention");
        self.clock.advance(retention).await;
        assert!(self.state(key).await.is_none(), "gone after its retention");
    }

    /// Keys do not interfere with each other.
    pub async fn keys_are_independent(&self) {
        let (a, b) = (random_key(), random_key());
        let (ta, tb) = (ClaimToken::new(), ClaimToken::new());
        assert!(matches!(
            self.claim(a, ta, fingerprint(12)).await,
            ClaimOutcome::Claimed
        ));
        assert!(matches!(
            self.claim(b, tb, fingerprint(12)).await,
            ClaimOutcome::Claimed
        ));
        assert!(ok(self.store.release(a, ta).await));
        assert!(matches!(
            self.state(b).await,
            Some((_, RecordState::InProgress { .. }))
        ));
        assert!(ok(self.store.release(b, tb).await));
    }
}
