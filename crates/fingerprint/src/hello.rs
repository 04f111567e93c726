//! The ClientHello handshake message (RFC 8446 §4.1.2, and RFC 5246 §7.4.1.2 before it), kept
//! as the client sent it: values in wire order, GREASE included, duplicates kept.
//!
//! Framing is checked strictly (every length must fit its enclosing structure exactly), so a
//! garbled hello is a precise error rather than a fingerprint of noise. The contents are taken as
//! they come: unknown extensions, cipher suites and versions are kept, not judged.

use crate::HelloError;
use crate::reader::Reader;

/// Extension types (IANA "TLS ExtensionType Values") this crate reads the contents of.
pub(crate) mod ext {
    pub(crate) const SERVER_NAME: u16 = 0x0000;
    pub(crate) const SUPPORTED_GROUPS: u16 = 0x000a;
    pub(crate) const EC_POINT_FORMATS: u16 = 0x000b;
    pub(crate) const SIGNATURE_ALGORITHMS: u16 = 0x000d;
    pub(crate) const ALPN: u16 = 0x0010;
    pub(crate) const SUPPORTED_VERSIONS: u16 = 0x002b;
}

/// The ClientHello handshake message type.
pub(crate) const CLIENT_HELLO: u8 = 1;

/// A parsed ClientHello: what the fingerprints need, every list in the client's wire order with
/// GREASE values kept (the fingerprints drop them).
///
/// Only the first occurrence of a repeated extension is read (RFC 8446 forbids repeats; each still
/// counts in [`ClientHello::extensions`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHello {
    /// `legacy_version` (`client_version` before TLS 1.3), e.g. `0x0303`; not the record version.
    pub legacy_version: u16,
    /// `cipher_suites`, including signalling values (`0x00ff`, `0x5600`).
    pub cipher_suites: Vec<u16>,
    /// The type of every extension.
    pub extensions: Vec<u16>,
    /// `supported_groups` (0x000a), called elliptic curves by JA3.
    pub supported_groups: Vec<u16>,
    /// `ec_point_formats` (0x000b).
    pub ec_point_formats: Vec<u8>,
    /// `signature_algorithms` (0x000d).
    pub signature_algorithms: Vec<u16>,
    /// The protocol names of `application_layer_protocol_negotiation` (0x0010), raw bytes.
    pub alpn: Vec<Vec<u8>>,
    /// `supported_versions` (0x002b).
    pub supported_versions: Vec<u16>,
    /// The first `host_name` of `server_name` (0x0000); bytes that are not UTF-8 are replaced
    /// (U+FFFD). `None` without the extension or without a host name in it: JA4's `d`/`i` looks
    /// at the extension itself, in [`ClientHello::extensions`].
    pub sni: Option<String>,
}

impl ClientHello {
    /// Parses one complete handshake message *including* its 4-byte header (type 1 and a 24-bit
    /// length that must match the bytes that follow exactly), as reassembled from the records.
    pub fn parse(handshake: &[u8]) -> Result<ClientHello, HelloError> {
        let mut r = Reader::new(handshake);
        let handshake_type = r.u8("msg_type")?;
        if handshake_type != CLIENT_HELLO {
            return Err(HelloError::NotClientHello { handshake_type });
        }
        let [a, b, c] = [r.u8("length")?, r.u8("length")?, r.u8("length")?];
        let declared = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
        let body = r.rest();
        if declared != body.len() {
            return Err(HelloError::LengthMismatch { declared, actual: body.len() });
        }
        Self::parse_body(body)
    }

    /// Parses a ClientHello body: the handshake message *after* its 4-byte header.
    pub fn parse_body(body: &[u8]) -> Result<ClientHello, HelloError> {
        let mut r = Reader::new(body);
        let mut hello = ClientHello { legacy_version: r.u16("legacy_version")?, ..ClientHello::default() };
        r.take(32, "random")?;
        let session_id = r.vec_u8("legacy_session_id")?.rest();
        if session_id.len() > 32 {
            return Err(HelloError::InvalidLength { field: "legacy_session_id", len: session_id.len() });
        }
        hello.cipher_suites = r.vec_u16("cipher_suites")?.u16_list("cipher_suites")?;
        r.vec_u8("legacy_compression_methods")?;
        // SSL 3.0 and TLS 1.0–1.2 clients may end the message here, with no extensions block.
        if r.is_empty() {
            return Ok(hello);
        }
        let mut extensions = r.vec_u16("extensions")?;
        r.finish("extensions")?;
        let mut read = 0u8; // a bit per extension of `ext` already read, so repeats are skipped
        while !extensions.is_empty() {
            let ty = extensions.u16("extension_type")?;
            let data = extensions.vec_u16("extension_data")?;
            hello.extensions.push(ty);
            let Some(bit) = known_bit(ty) else { continue };
            if read & bit == 0 {
                read |= bit;
                hello.read_extension(ty, data)?;
            }
        }
        Ok(hello)
    }

    /// Reads the contents of one extension of `ext`.
    fn read_extension(&mut self, ty: u16, mut data: Reader<'_>) -> Result<(), HelloError> {
        match ty {
            ext::SERVER_NAME => {
                let mut names = data.vec_u16("server_name_list")?;
                data.finish("server_name")?;
                while !names.is_empty() {
                    let name_type = names.u8("name_type")?;
                    let name = names.vec_u16("host_name")?.rest();
                    if name_type == 0 && self.sni.is_none() {
                        self.sni = Some(String::from_utf8_lossy(name).into_owned());
                    }
                }
                Ok(())
            }
            ext::SUPPORTED_GROUPS => {
                self.supported_groups = data.vec_u16("named_group_list")?.u16_list("named_group_list")?;
                data.finish("supported_groups")
            }
            ext::EC_POINT_FORMATS => {
                self.ec_point_formats = data.vec_u8("ec_point_format_list")?.rest().to_vec();
                data.finish("ec_point_formats")
            }
            ext::SIGNATURE_ALGORITHMS => {
                let list = data.vec_u16("supported_signature_algorithms")?;
                self.signature_algorithms = list.u16_list("supported_signature_algorithms")?;
                data.finish("signature_algorithms")
            }
            ext::ALPN => {
                let mut names = data.vec_u16("protocol_name_list")?;
                data.finish("application_layer_protocol_negotiation")?;
                while !names.is_empty() {
                    self.alpn.push(names.vec_u8("protocol_name")?.rest().to_vec());
                }
                Ok(())
            }
            ext::SUPPORTED_VERSIONS => {
                self.supported_versions = data.vec_u8("versions")?.u16_list("versions")?;
                data.finish("supported_versions")
            }
            _ => Ok(()),
        }
    }
}

/// The bit of an extension whose contents are read, `None` for the others.
const fn known_bit(ty: u16) -> Option<u8> {
    match ty {
        ext::SERVER_NAME => Some(1),
        ext::SUPPORTED_GROUPS => Some(1 << 1),
        ext::EC_POINT_FORMATS => Some(1 << 2),
        ext::SIGNATURE_ALGORITHMS => Some(1 << 3),
        ext::ALPN => Some(1 << 4),
        ext::SUPPORTED_VERSIONS => Some(1 << 5),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::ClientHello;
    use crate::HelloError;

    /// A minimal TLS 1.0-style body: version, random, empty session id, one suite, null compression.
    fn body(extensions: Option<&[u8]>) -> Vec<u8> {
        let mut b = vec![0x03, 0x01];
        b.extend([7; 32]);
        b.extend([0, 0, 2, 0x00, 0x2f, 1, 0]);
        if let Some(ext) = extensions {
            b.extend(u16::try_from(ext.len()).unwrap().to_be_bytes());
            b.extend(ext);
        }
        b
    }

    #[test]
    fn a_hello_without_extensions_block_parses() {
        let hello = ClientHello::parse_body(&body(None)).unwrap();
        assert_eq!((hello.legacy_version, hello.cipher_suites), (0x0301, vec![0x002f]));
        assert!(hello.extensions.is_empty());
    }

    #[test]
    fn a_repeated_extension_counts_twice_but_is_read_once() {
        let ext = [0, 0x10, 0, 5, 0, 3, 2, b'h', b'2', 0, 0x10, 0, 4, 0, 2, 1, b'x'];
        let hello = ClientHello::parse_body(&body(Some(&ext))).unwrap();
        assert_eq!(hello.extensions, [0x10, 0x10]);
        assert_eq!(hello.alpn, [b"h2".to_vec()]);
    }

    #[test]
    fn framing_errors_name_the_field() {
        // ALPN whose protocol_name_list says 4 bytes but the extension holds 3.
        let ext = [0, 0x10, 0, 5, 0, 4, 2, b'h', b'2'];
        assert_eq!(
            ClientHello::parse_body(&body(Some(&ext))),
            Err(HelloError::Truncated { field: "protocol_name_list" })
        );
        // An extension with a byte after its contents.
        let ext = [0, 0x0b, 0, 3, 1, 0, 9];
        assert_eq!(
            ClientHello::parse_body(&body(Some(&ext))),
            Err(HelloError::TrailingBytes { field: "ec_point_formats" })
        );
        // A byte after the extensions block.
        let mut b = body(Some(&[]));
        b.push(0);
        assert_eq!(ClientHello::parse_body(&b), Err(HelloError::TrailingBytes { field: "extensions" }));
        // A 33-byte session id.
        let mut b = vec![3, 3];
        b.extend([0; 32]);
        b.push(33);
        b.extend([0; 33]);
        assert_eq!(ClientHello::parse_body(&b), Err(HelloError::InvalidLength { field: "legacy_session_id", len: 33 }));
    }

    #[test]
    fn parse_checks_the_handshake_header() {
        let b = body(None);
        let mut msg = vec![1, 0, 0, u8::try_from(b.len()).unwrap()];
        msg.extend(&b);
        assert_eq!(ClientHello::parse(&msg), ClientHello::parse_body(&b));
        msg.push(0);
        assert_eq!(
            ClientHello::parse(&msg),
            Err(HelloError::LengthMismatch { declared: b.len(), actual: b.len() + 1 })
        );
        msg[0] = 2;
        assert_eq!(ClientHello::parse(&msg), Err(HelloError::NotClientHello { handshake_type: 2 }));
    }
}
