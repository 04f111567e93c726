//! The TLS record layer on a fresh connection (RFC 8446 §5.1): handshake records carrying the
//! ClientHello, which a client may fragment over several records.
//!
//! Every check that can fail is made as soon as its byte arrives, so a client that is not
//! speaking TLS is refused on its first byte rather than after a timeout.

use crate::hello::CLIENT_HELLO;
use crate::{ClientHello, HelloError, MAX_HELLO_BYTES, MAX_RECORD_LEN};

/// The record content type of handshake messages.
const HANDSHAKE: u8 = 22;
/// A record header: content type, protocol version, 16-bit length.
const RECORD_HEADER_LEN: usize = 5;
/// A handshake message header: type and 24-bit length.
const HANDSHAKE_HEADER_LEN: usize = 4;

/// Reads TLS plaintext records, as received on a fresh TCP connection, from `bytes`.
///
/// - `Ok(None)`: a valid beginning; more bytes are needed;
/// - `Ok(Some(hello))`: the first complete ClientHello handshake message, possibly spread over
///   several records; bytes after it (the rest of its record, later records) are not looked at;
/// - `Err`: not a TLS ClientHello, or one needing more than [`MAX_HELLO_BYTES`] of records.
///
/// Never panics, and reads at most [`MAX_HELLO_BYTES`] of `bytes`: call it again with all the
/// bytes received so far as they arrive.
pub fn client_hello_from_records(bytes: &[u8]) -> Result<Option<ClientHello>, HelloError> {
    let window = bytes.get(..MAX_HELLO_BYTES).unwrap_or(bytes);
    let mut handshake: Vec<u8> = Vec::new();
    let mut rest = window;
    while let Some(&content_type) = rest.first() {
        if content_type != HANDSHAKE {
            return Err(HelloError::NotHandshake { content_type });
        }
        if let Some(&major) = rest.get(1)
            && major != 3
        {
            return Err(HelloError::RecordVersion { major });
        }
        let Some((header, body)) = rest.split_first_chunk::<RECORD_HEADER_LEN>() else { break };
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 {
            return Err(HelloError::EmptyRecord);
        }
        if len > MAX_RECORD_LEN {
            return Err(HelloError::RecordTooLong { len });
        }
        let (fragment, after) = body.split_at_checked(len).unwrap_or((body, &[]));
        handshake.extend_from_slice(fragment);
        if let Some(message) = complete_message(&handshake)? {
            return ClientHello::parse(message).map(Some);
        }
        if fragment.len() < len {
            break; // the record itself is still arriving
        }
        rest = after;
    }
    if bytes.len() >= MAX_HELLO_BYTES {
        // The hello did not complete within the bytes we agree to read.
        return Err(HelloError::TooLarge { limit: MAX_HELLO_BYTES });
    }
    Ok(None)
}

/// The first handshake message of `handshake` once it has fully arrived; checks its type and
/// size from their first bytes.
fn complete_message(handshake: &[u8]) -> Result<Option<&[u8]>, HelloError> {
    let Some(&handshake_type) = handshake.first() else { return Ok(None) };
    if handshake_type != CLIENT_HELLO {
        return Err(HelloError::NotClientHello { handshake_type });
    }
    let Some(&[_, a, b, c]) = handshake.first_chunk::<HANDSHAKE_HEADER_LEN>() else { return Ok(None) };
    let total = HANDSHAKE_HEADER_LEN + (usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c));
    // The fewest record bytes that can carry it: full-size records, one header each.
    let framed = total + RECORD_HEADER_LEN * total.div_ceil(MAX_RECORD_LEN);
    if framed > MAX_HELLO_BYTES {
        return Err(HelloError::TooLarge { limit: MAX_HELLO_BYTES });
    }
    Ok(handshake.get(..total))
}

#[cfg(test)]
mod tests {
    use super::client_hello_from_records;
    use crate::{HelloError, MAX_HELLO_BYTES};

    #[test]
    fn refuses_at_the_first_wrong_byte() {
        assert_eq!(client_hello_from_records(b"G"), Err(HelloError::NotHandshake { content_type: b'G' }));
        assert_eq!(client_hello_from_records(&[22, 2]), Err(HelloError::RecordVersion { major: 2 }));
        assert_eq!(client_hello_from_records(&[22, 3, 1, 0, 0]), Err(HelloError::EmptyRecord));
        assert_eq!(client_hello_from_records(&[22, 3, 1, 0x40, 1]), Err(HelloError::RecordTooLong { len: 0x4001 }));
        assert_eq!(
            client_hello_from_records(&[22, 3, 1, 0, 9, 2]),
            Err(HelloError::NotClientHello { handshake_type: 2 })
        );
    }

    #[test]
    fn waits_for_a_valid_beginning() {
        for prefix in [&[][..], &[22], &[22, 3], &[22, 3, 1, 0], &[22, 3, 1, 0, 9], &[22, 3, 1, 0, 9, 1, 0, 0]] {
            assert_eq!(client_hello_from_records(prefix), Ok(None), "{prefix:?}");
        }
    }

    #[test]
    fn a_declared_size_past_the_bound_is_refused_from_its_header() {
        // 16 KiB + 11 of hello needs two records: 16395 + 10 bytes of headers > 16404.
        let len = MAX_HELLO_BYTES - 4 - 10 + 1;
        let [_, a, b, c] = u32::try_from(len).unwrap().to_be_bytes();
        let bytes = [22, 3, 1, 0x40, 0, 1, a, b, c];
        assert_eq!(client_hello_from_records(&bytes), Err(HelloError::TooLarge { limit: MAX_HELLO_BYTES }));
        // One byte less fits (two full-size records).
        let [_, a, b, c] = u32::try_from(len - 1).unwrap().to_be_bytes();
        assert_eq!(client_hello_from_records(&[22, 3, 1, 0x40, 0, 1, a, b, c]), Ok(None));
    }
}
