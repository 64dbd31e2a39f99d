//! Record keys: SHA-256 over framed parts, printed as hex (the fingerprints frame their input in
//! `fingerprint`).

use sha2::{Digest, Sha256};
use std::fmt;

/// Feeds `part` to `hasher` behind its length, so concatenations cannot collide.
pub(crate) fn update_framed(hasher: &mut Sha256, part: &[u8]) {
    hasher.update((part.len() as u64).to_be_bytes());
    hasher.update(part);
}

pub(crate) fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    // One `write_str` per 32 bytes: a `write!` per byte went through the formatting machinery
    // 32 times for every Redis key name.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(32) {
        let out = &mut buf[..chunk.len() * 2];
        for (pair, byte) in out.chunks_exact_mut(2).zip(chunk) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        f.write_str(std::str::from_utf8(out).map_err(|_| fmt::Error)?)?;
    }
    Ok(())
}
