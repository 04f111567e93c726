//! Why some bytes are not a ClientHello this crate can fingerprint.

/// Why the bytes are not a (bounded, well-formed) TLS ClientHello.
///
/// `field` names are the TLS presentation-language names of RFC 8446 (and of the extensions'
/// RFCs), so an error reads like the part of the message that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// A record's content type is not handshake (22): the client speaks something else than TLS
    /// (`b'G'` for `GET / HTTP/1.1`), or sent an alert or other record before its ClientHello.
    #[error("not a TLS handshake record (content type {content_type})")]
    NotHandshake {
        /// The record's first byte.
        content_type: u8,
    },
    /// A record's protocol version does not start with 3 (SSL 3.0 and every TLS version do):
    /// an SSLv2-framed hello or not TLS at all.
    #[error("not a TLS record (record version major byte {major})")]
    RecordVersion {
        /// The record's second byte.
        major: u8,
    },
    /// A handshake record of length 0, which RFC 8446 §5.1 forbids.
    #[error("empty TLS handshake record")]
    EmptyRecord,
    /// A record longer than the 2^14 bytes a TLS plaintext record may carry.
    #[error("TLS record of {len} bytes, more than the 16384 allowed")]
    RecordTooLong {
        /// The record's declared length.
        len: usize,
    },
    /// The first handshake message is not a ClientHello (type 1).
    #[error("handshake message type {handshake_type} is not a ClientHello (1)")]
    NotClientHello {
        /// The handshake message's type.
        handshake_type: u8,
    },
    /// The ClientHello, with its record framing, needs more than [`crate::MAX_HELLO_BYTES`].
    #[error("ClientHello larger than {limit} bytes of TLS records")]
    TooLarge {
        /// [`crate::MAX_HELLO_BYTES`].
        limit: usize,
    },
    /// A handshake message whose declared length is not the length of the bytes given.
    #[error("handshake message declares {declared} bytes but {actual} were given")]
    LengthMismatch {
        /// The length in the handshake header.
        declared: usize,
        /// The bytes given after the header.
        actual: usize,
    },
    /// A field runs past the end of the structure that holds it.
    #[error("ClientHello field `{field}` is truncated")]
    Truncated {
        /// The field.
        field: &'static str,
    },
    /// A field's length is not one the protocol allows (an odd length for a list of 16-bit
    /// values, a session id longer than 32 bytes).
    #[error("ClientHello field `{field}` has an invalid length {len}")]
    InvalidLength {
        /// The field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// Bytes left over after a structure that should have ended there.
    #[error("unexpected bytes after ClientHello field `{field}`")]
    TrailingBytes {
        /// The structure that should have ended.
        field: &'static str,
    },
}
