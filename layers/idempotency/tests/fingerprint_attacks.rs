//! The request fingerprints under attack (the `fingerprint` module docs): framing keeps near
//! requests apart; a crafted xxh3 collision only replays a client's own first answer under its
//! own key (documented), and `Sha256Fingerprint` refuses it; records stored under either kind
//! replay to their retries after a switch to the other.

use bytes::Bytes;
use http::StatusCode;
use tower::Layer;
use tower_once_idempotency::fingerprint::{Fingerprinter, Sha256Fingerprint, Xxh3Fingerprint};
use tower_once_idempotency::store::MemoryStore;
use tower_once_idempotency::IdempotencyLayer;

mod support;

use support::{post, send, Handler};

/// XXH3's default secret (xxhash.h `XXH3_kSecret`), public in every implementation.
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

/// Two different bodies for `POST {path}` with the same xxh3-128 fingerprint, crafted in
/// microseconds: XXH3's long-input accumulator adds `lo32(w ^ s) * hi32(w ^ s)` to one lane and
/// the raw word `w` to its neighbour. A word whose low half equals the secret's contributes no
/// product, so moving 1 between the high halves of two such words (same lane, two stripes of one
/// block) leaves every accumulator, and the digest, unchanged.
fn colliding_bodies(path: &str) -> (Vec<u8>, Vec<u8>) {
    // What `Xxh3Fingerprint` feeds before the body: its prefix, then method, path (no query)
    // and the body's length, each behind an 8-byte length.
    let body_start = "tower-once/fingerprint/xxh3/v1".len() + 8 + 4 + 8 + path.len() + 8;
    let len = 2048;
    // Stripes of one block (16 stripes of 64 bytes with the default secret), well clear of the
    // end; lane 0 of stripes 2 and 3 (bytes the body holds). A binary body (an upload).
    let (lane, s1, s2) = (0, 2, 3);
    assert!(64 * s1 >= body_start + 16);
    let make = |hi1: &[u8; 4], hi2: &[u8; 4]| {
        let mut body = vec![b'x'; len];
        let prefix = b"{\"memo\":\"";
        body[..prefix.len()].copy_from_slice(prefix);
        let suffix = b"\"}";
        body[len - suffix.len()..].copy_from_slice(suffix);
        for (s, hi) in [(s1, hi1), (s2, hi2)] {
            let at = 64 * s + 8 * lane - body_start;
            body[at..at + 4].copy_from_slice(&SECRET[8 * s + 8 * lane..8 * s + 8 * lane + 4]);
            body[at + 4..at + 8].copy_from_slice(hi);
        }
        body
    };
    // Little-endian high halves: "1000" is "0000" plus one.
    (make(b"1000", b"0000"), make(b"0000", b"1000"))
}

fn post_bytes(uri: &str, key: &str, body: Vec<u8>) -> http::Request<http_body_util::Full<Bytes>> {
    http::Request::post(uri)
        .header("idempotency-key", key)
        .header("content-type", "application/octet-stream")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap()
}

fn parts(method: &str, uri: &str) -> http::request::Parts {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .body(())
        .unwrap()
        .into_parts()
        .0
}

/// The crafted pair differs, and the default fingerprint cannot tell it apart (xxh3 has no
/// secret: the documented limit); SHA-256 can.
#[test]
fn a_crafted_xxh3_collision_exists_and_sha256_tells_the_bodies_apart() {
    let (a, b) = colliding_bodies("/charges");
    let p = parts("POST", "/charges");
    let (a, b) = (Bytes::from(a), Bytes::from(b));
    assert_ne!(a, b);
    assert_ne!(
        Sha256Fingerprint.fingerprint(&p, &a),
        Sha256Fingerprint.fingerprint(&p, &b)
    );
    assert_eq!(
        Xxh3Fingerprint.fingerprint(&p, &a),
        Xxh3Fingerprint.fingerprint(&p, &b),
        "the documented limit of the default"
    );
}

/// Through the layer: by default the crafted second body under the same key gets the first's
/// answer (nothing runs twice); with `Sha256Fingerprint` it gets `422`.
#[tokio::test(start_paused = true)]
async fn a_crafted_different_body_is_replayed_by_default_and_refused_with_sha256() {
    let (a, b) = colliding_bodies("/charges");
    let handler = Handler::default();
    let default = IdempotencyLayer::new().layer(handler.clone());
    send(&default, post_bytes("/charges", "k", a.clone())).await;
    let second = send(&default, post_bytes("/charges", "k", b.clone())).await;
    assert_eq!(
        (second.status, second.replayed()),
        (StatusCode::CREATED, true)
    );
    assert_eq!(handler.runs(), 1, "nothing ran twice");

    let handler = Handler::default();
    let strict = IdempotencyLayer::new()
        .fingerprint_with(Sha256Fingerprint)
        .layer(handler.clone());
    let first = send(&strict, post_bytes("/charges", "k", a)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let second = send(&strict, post_bytes("/charges", "k", b)).await;
    assert_eq!(
        (second.status, second.replayed()),
        (StatusCode::UNPROCESSABLE_ENTITY, false)
    );
    assert_eq!(handler.runs(), 1);
}

/// Framing: these pairs are different requests to the same record; each must differ.
#[test]
fn framing_keeps_near_requests_apart() {
    let body = Bytes::from_static(b"");
    let pairs = [
        (("POST", "/a"), ("POST", "/a?")),
        (("POST", "/a?"), ("POST", "/a?=")),
        (("POST", "/a?x"), ("POST", "/a?x=")),
        (("POST", "/a%3Fx"), ("POST", "/a?x")),
        (("POST", "/a%2Fb"), ("POST", "/a/b")),
        (("POST", "/ab"), ("PO", "/STab")),
    ];
    for ((m1, u1), (m2, u2)) in pairs {
        for fp in [
            &Xxh3Fingerprint as &dyn Fingerprinter,
            &Sha256Fingerprint as &dyn Fingerprinter,
        ] {
            assert_ne!(
                fp.fingerprint(&parts(m1, u1), &body),
                fp.fingerprint(&parts(m2, u2), &body),
                "{m1} {u1} vs {m2} {u2}"
            );
        }
    }
    // Path vs body boundary: "/a" + body "b" vs "/ab" + empty body.
    for fp in [
        &Xxh3Fingerprint as &dyn Fingerprinter,
        &Sha256Fingerprint as &dyn Fingerprinter,
    ] {
        assert_ne!(
            fp.fingerprint(&parts("POST", "/a"), &Bytes::from_static(b"b")),
            fp.fingerprint(&parts("POST", "/ab"), &Bytes::new()),
        );
    }
}

/// `recognizes` never accepts another request's SHA-256, nor an xxh3 fingerprint of the same
/// request computed differently.
#[test]
fn recognizes_only_the_same_requests_sha256() {
    let p = parts("POST", "/charges?x=1");
    let body = Bytes::from_static(b"a");
    let sha = Sha256Fingerprint.fingerprint(&p, &body);
    assert!(Xxh3Fingerprint.recognizes(&p, &body, &sha));
    assert!(!Xxh3Fingerprint.recognizes(&p, &Bytes::from_static(b"b"), &sha));
    assert!(!Xxh3Fingerprint.recognizes(&parts("POST", "/charges?x=2"), &body, &sha));
    assert!(!Xxh3Fingerprint.recognizes(&parts("POST", "/charges"), &body, &sha));
}

/// The way back: a deployment that follows the docs' advice ("for a threat model where that
/// matters, `Sha256Fingerprint` is one builder call away") after running the xxh3 default
/// answers the in-flight retries of its records with `422`.
#[tokio::test(start_paused = true)]
async fn switching_to_sha256_after_the_xxh3_default_keeps_replaying_retries() {
    let handler = Handler::default();
    let store = MemoryStore::new();
    let before = IdempotencyLayer::with_store(store.clone()).layer(handler.clone());
    let after = IdempotencyLayer::with_store(store)
        .fingerprint_with(Sha256Fingerprint)
        .layer(handler.clone());
    let first = send(&before, post("/charges", Some("k"), "a")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = send(&after, post("/charges", Some("k"), "a")).await;
    assert_eq!(handler.runs(), 1);
    assert!(
        retry.replayed(),
        "retry after switching to SHA-256: {:?}",
        retry.status
    );
}
