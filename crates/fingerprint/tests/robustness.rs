//! Robustness of the record reader: any input is an answer (need more, a hello, or a precise
//! error), never a panic nor an endless "need more"; clients that are not TLS are refused at once.

mod common;

use common::{HelloBuilder, records};
use proptest::collection::vec;
use proptest::prelude::*;
use tollgate_fingerprint::{ClientHello, HelloError, MAX_HELLO_BYTES, client_hello_from_records};

/// Extension types whose contents the parser reads: random contents there would be malformed.
const READ: [u16; 6] = [0x0000, 0x000a, 0x000b, 0x000d, 0x0010, 0x002b];

fn grease() -> impl Strategy<Value = u16> {
    (0u16..16).prop_map(|i| (i << 12) | 0x0a00 | (i << 4) | 0x0a)
}

fn value() -> impl Strategy<Value = u16> {
    prop_oneof![4 => any::<u16>(), 1 => grease()]
}

/// Well-formed ClientHellos: random lists with GREASE, optional SNI and ALPN, other extensions
/// with random contents, all extensions in random order.
fn hello() -> impl Strategy<Value = HelloBuilder> {
    let lists = (vec(value(), 0..40), vec(value(), 0..8), vec(any::<u8>(), 0..4), vec(value(), 0..12));
    let named = (
        prop_oneof![Just(0x0303u16), Just(0x0301), any::<u16>()],
        proptest::option::of(
            vec(prop_oneof![b'a'..=b'z', b'0'..=b'9', Just(b'.')], 1..30).prop_map(|h| String::from_utf8(h).unwrap()),
        ),
        proptest::option::of(vec(vec(any::<u8>(), 0..12), 0..4)),
        proptest::option::of(vec(value(), 0..6)),
    );
    let others =
        vec((value().prop_map(|ty| if READ.contains(&ty) { ty ^ 0x8000 } else { ty }), vec(any::<u8>(), 0..40)), 0..10);
    (lists, named, others)
        .prop_map(|((ciphers, groups, formats, sigs), (legacy, sni, alpn, versions), others)| {
            let mut b = HelloBuilder::new(legacy).ciphers(&ciphers).groups(&groups).point_formats(&formats);
            b = b.signature_algorithms(&sigs);
            if let Some(host) = sni {
                b = b.sni(&host);
            }
            if let Some(protocols) = alpn {
                b = b.alpn(&protocols.iter().map(Vec::as_slice).collect::<Vec<_>>());
            }
            if let Some(versions) = versions {
                b = b.versions(&versions);
            }
            for (ty, data) in others {
                b = b.ext(ty, &data);
            }
            b
        })
        .prop_flat_map(|b| {
            let extensions = b.extensions.clone().unwrap_or_default();
            (Just(b), Just(extensions).prop_shuffle())
        })
        .prop_map(|(mut b, extensions)| {
            b.extensions = Some(extensions);
            b
        })
}

/// JA4's shape: `t`, version, `d`/`i`, four digits, two ALPN characters (alphanumeric, either
/// case), two 12-digit lowercase hex hashes.
fn assert_ja4_shape(ja4: &str) {
    let parts: Vec<&str> = ja4.split('_').collect();
    let [a, b, c] = parts.as_slice() else { panic!("three parts: {ja4}") };
    let a = a.as_bytes();
    assert_eq!(a.len(), 10, "{ja4}");
    assert_eq!(a[0], b't');
    assert!(a[3] == b'd' || a[3] == b'i', "{ja4}");
    assert!(a[4..8].iter().all(u8::is_ascii_digit), "{ja4}");
    assert!(a[8..].iter().all(u8::is_ascii_alphanumeric), "{ja4}");
    for hash in [b, c] {
        assert!(hash.len() == 12 && hash.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{ja4}");
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..2048)) {
        let _ = client_hello_from_records(&bytes);
        let _ = ClientHello::parse(&bytes);
        let _ = ClientHello::parse_body(&bytes);
    }

    /// Arbitrary message bodies in valid records reach the ClientHello parser: a complete
    /// message is a hello or an error, never "need more".
    #[test]
    fn arbitrary_bodies_in_valid_records_are_answered(body in vec(any::<u8>(), 0..600), size in 1usize..200) {
        let [_, a, b, c] = u32::try_from(body.len()).unwrap().to_be_bytes();
        let message = [&[1, a, b, c][..], &body].concat();
        let result = client_hello_from_records(&records(&message, std::iter::repeat(size)));
        prop_assert_ne!(result, Ok(None));
    }

    /// Any well-formed hello in any record split: every strict prefix needs more bytes, the whole
    /// gives the hello the message parses to, with the lists as written and well-shaped
    /// fingerprints.
    #[test]
    fn every_truncation_of_a_valid_hello_needs_more(b in hello(), sizes in vec(1usize..400, 1..20)) {
        let bytes = records(&b.message(), sizes);
        for end in 0..bytes.len() {
            prop_assert_eq!(client_hello_from_records(&bytes[..end]), Ok(None));
        }
        let hello = client_hello_from_records(&bytes).unwrap().unwrap();
        prop_assert_eq!(&hello, &ClientHello::parse(&b.message()).unwrap());
        prop_assert_eq!(&hello.cipher_suites, &b.ciphers);
        let types: Vec<u16> = b.extensions.iter().flatten().map(|(ty, _)| *ty).collect();
        prop_assert_eq!(&hello.extensions, &types);
        assert_ja4_shape(&hello.ja4());
        let ja3 = hello.ja3();
        prop_assert!(ja3.len() == 32 && ja3.bytes().all(|c| c.is_ascii_hexdigit()));
        // Bytes after the hello (the client's next records) change nothing.
        let mut more = bytes.clone();
        more.extend([23, 3, 3, 0, 1, 0]);
        prop_assert_eq!(client_hello_from_records(&more), Ok(Some(hello)));
    }

    /// One byte of a valid hello changed: still an answer, never a panic.
    #[test]
    fn corrupted_hellos_never_panic(b in hello(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = b.records(128);
        let i = at.index(bytes.len());
        bytes[i] = byte;
        let _ = client_hello_from_records(&bytes);
    }
}

#[test]
fn plain_http_is_refused_on_its_first_byte() {
    let request = b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";
    for end in 1..=request.len() {
        assert_eq!(client_hello_from_records(&request[..end]), Err(HelloError::NotHandshake { content_type: b'G' }));
    }
    // An SSLv2-framed hello (first byte 0x80), an alert, a record of another protocol version.
    assert_eq!(client_hello_from_records(&[0x80, 0x2e, 0x01]), Err(HelloError::NotHandshake { content_type: 0x80 }));
    assert_eq!(client_hello_from_records(&[21, 3, 1, 0, 2, 2, 40]), Err(HelloError::NotHandshake { content_type: 21 }));
    assert_eq!(client_hello_from_records(&[22, 0xfe, 0xfd]), Err(HelloError::RecordVersion { major: 0xfe }));
}

/// A ChangeCipherSpec record in the middle of a fragmented hello.
#[test]
fn a_foreign_record_inside_the_hello_is_refused() {
    let b = HelloBuilder::new(0x0303).ciphers(&[0x1301]).sni("example.com");
    let mut bytes = b.records(20);
    bytes.truncate(25);
    bytes.extend([20, 3, 3, 0, 1, 1]);
    assert_eq!(client_hello_from_records(&bytes), Err(HelloError::NotHandshake { content_type: 20 }));
}

/// A hello padded (extension 0x0015) to exactly `total` bytes of handshake message.
fn padded_to(total: usize) -> HelloBuilder {
    let unpadded = HelloBuilder::new(0x0303).ciphers(&[0x1301]).message().len();
    HelloBuilder::new(0x0303).ciphers(&[0x1301]).ext(0x0015, &vec![0; total - unpadded - 4])
}

#[test]
fn a_16_kib_hello_over_four_records_is_read() {
    let b = padded_to(16 * 1024);
    let bytes = b.records(4096);
    assert_eq!(bytes.len(), MAX_HELLO_BYTES);
    let hello = client_hello_from_records(&bytes).unwrap().unwrap();
    assert_eq!(hello.extensions, [0x0015]);
}

#[test]
fn a_hello_too_large_to_fit_is_refused_from_its_header() {
    let bytes = padded_to(MAX_HELLO_BYTES).records(16_384);
    assert_eq!(client_hello_from_records(&bytes[..9]), Err(HelloError::TooLarge { limit: MAX_HELLO_BYTES }));
}

/// A hello that would fit in large records but arrives in 1-byte records: refused once
/// MAX_HELLO_BYTES have arrived, not an endless "need more".
#[test]
fn tiny_records_past_the_bound_are_refused() {
    let bytes = records(&padded_to(4000).message(), std::iter::repeat(1));
    assert_eq!(client_hello_from_records(&bytes[..MAX_HELLO_BYTES - 1]), Ok(None));
    assert_eq!(
        client_hello_from_records(&bytes[..MAX_HELLO_BYTES]),
        Err(HelloError::TooLarge { limit: MAX_HELLO_BYTES })
    );
    assert_eq!(client_hello_from_records(&bytes), Err(HelloError::TooLarge { limit: MAX_HELLO_BYTES }));
}
