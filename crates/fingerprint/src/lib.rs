//! # tollgate-fingerprint
//!
//! TLS client fingerprints from the ClientHello exactly as the client sent it, before any TLS
//! library has normalised or reordered it. Pure: no I/O, no clock, no global state.
//!
//! - [`client_hello_from_records`]: the first bytes of a TCP connection (TLS plaintext records)
//!   to a [`ClientHello`], `Ok(None)` while more bytes are needed; a quick [`HelloError`] for
//!   anything that is not a ClientHello (a plain-HTTP client, an SSLv2 hello) or that grows past
//!   [`MAX_HELLO_BYTES`];
//! - [`ClientHello::parse`] / [`ClientHello::parse_body`]: one handshake message;
//! - [`ClientHello::ja3_string`] / [`ClientHello::ja3`]: Salesforce's JA3 (MD5);
//! - [`ClientHello::ja4`] / [`ClientHello::ja4_raw`]: FoxIO's JA4 for TLS over TCP.
//!
//! GREASE values (RFC 8701) are kept in the parsed [`ClientHello`], exactly as sent, and removed
//! by the fingerprints.
//!
//! ```
//! # fn main() -> Result<(), tollgate_fingerprint::HelloError> {
//! // A plain-HTTP client on the TLS port is refused from its first byte.
//! assert!(tollgate_fingerprint::client_hello_from_records(b"G").is_err());
//! // A TLS handshake record whose ClientHello has not fully arrived: wait for more bytes.
//! assert_eq!(tollgate_fingerprint::client_hello_from_records(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])?, None);
//! # Ok(())
//! # }
//! ```

mod error;
mod hello;
mod ja3;
mod ja4;
mod reader;
mod records;

pub use error::HelloError;
pub use hello::ClientHello;
pub use records::client_hello_from_records;

/// The most bytes of TLS records read while waiting for a ClientHello: every size the client
/// chooses (record and handshake lengths) is bounded by it, so a client cannot make the server
/// buffer more.
///
/// It covers a ClientHello handshake message of 16 KiB (header included) spread over up to four
/// records (5-byte headers each); real ClientHellos are far smaller (about 2 KiB for a browser
/// offering a post-quantum key share). A hello whose smallest possible framing would exceed it is
/// refused as soon as its handshake header arrives, and bytes past it are never looked at.
pub const MAX_HELLO_BYTES: usize = 16 * 1024 + 5 * 4;

/// The largest TLS plaintext record fragment (RFC 8446 §5.1: 2^14 bytes).
const MAX_RECORD_LEN: usize = 1 << 14;

/// Whether `value` is a GREASE value (RFC 8701): `0x?a?a` with both bytes equal, that is
/// 0x0a0a, 0x1a1a, …, 0xfafa. Clients send them at random to keep servers tolerant; fingerprints
/// drop them so one client keeps one fingerprint.
const fn is_grease(value: u16) -> bool {
    let [high, low] = value.to_be_bytes();
    high == low && low & 0x0f == 0x0a
}

/// Lowercase hex of `bytes`, as both fingerprints print their hashes.
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::{is_grease, to_hex};

    #[test]
    fn hex_is_lowercase_and_two_digits_a_byte() {
        assert_eq!(to_hex(&[0x00, 0x0a, 0xba, 0xff]), "000abaff");
        assert_eq!(to_hex(&[]), "");
    }

    #[test]
    fn grease_values_are_exactly_the_sixteen_of_rfc_8701() {
        let grease: Vec<u16> = (0..=u16::MAX).filter(|&v| is_grease(v)).collect();
        let expected: Vec<u16> = (0..16u16).map(|i| (i << 12) | 0x0a00 | (i << 4) | 0x0a).collect();
        assert_eq!(grease, expected);
        assert_eq!(grease.first(), Some(&0x0a0a));
        assert_eq!(grease.last(), Some(&0xfafa));
    }
}
