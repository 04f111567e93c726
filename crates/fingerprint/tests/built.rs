//! ClientHellos written by the test's own builder, with fingerprints written out by hand: the JA3
//! strings and JA4 raw strings below were composed from the hello definitions (GREASE removed,
//! lists sorted or not as each spec says), and their hashes computed separately with Python's
//! `hashlib` (`md5(ja3).hexdigest()`, `sha256(list).hexdigest()[:12]`). A wrong order, a missed
//! sort or a GREASE value left in would change them.

mod common;

use common::HelloBuilder;
use tollgate_fingerprint::{ClientHello, client_hello_from_records};

fn from_records(bytes: &[u8]) -> ClientHello {
    client_hello_from_records(bytes).expect("a valid hello").expect("a complete hello")
}

/// Asserts the four fingerprints of `hello`.
fn assert_fingerprints(hello: &ClientHello, ja3_string: &str, ja3: &str, ja4_raw: &str, ja4: &str) {
    assert_eq!(hello.ja3_string(), ja3_string);
    assert_eq!(hello.ja3(), ja3);
    assert_eq!(hello.ja4_raw(), ja4_raw);
    assert_eq!(hello.ja4(), ja4);
}

/// A browser-like TLS 1.3 hello: GREASE in ciphers, extensions (first and last), groups and
/// supported_versions (0x7a7a, numerically above 0x0304, must not be taken as the version), SNI,
/// ALPN, spread over records of 40 bytes.
#[test]
fn tls13_with_grease_sni_and_alpn_over_several_records() {
    let builder = HelloBuilder::new(0x0303)
        .ciphers(&[0x3a3a, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0x00ff])
        .ext(0x0a0a, &[])
        .sni("example.com")
        .ext(0x0017, &[])
        .alpn(&[b"h2", b"http/1.1"])
        .groups(&[0x6a6a, 0x001d, 0x0017, 0x0018])
        .point_formats(&[0])
        .signature_algorithms(&[0x0403, 0x0804, 0x0401])
        .versions(&[0x7a7a, 0x0304, 0x0303])
        .ext(0x0033, &[0, 6, 0, 0x1d, 0, 2, 0xab, 0xcd])
        .ext(0xff01, &[0])
        .ext(0x1a1a, &[0]);
    let records = builder.records(40);
    assert!(records.len() >= builder.message().len() + 4 * 5, "at least four records");
    let hello = from_records(&records);
    assert_eq!(hello, ClientHello::parse(&builder.message()).unwrap());
    assert_eq!(hello.sni.as_deref(), Some("example.com"));
    assert_eq!(hello.alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    assert_eq!(hello.supported_versions, [0x7a7a, 0x0304, 0x0303]);
    assert_eq!(hello.extensions.first(), Some(&0x0a0a), "GREASE kept in the parsed hello");
    assert_fingerprints(
        &hello,
        "771,4865-4866-4867-49195-49199-255,0-23-16-10-11-13-43-51-65281,29-23-24,0",
        "ccf87a566bad7369482576e4b91da9f7",
        "t13d0609h2_00ff,1301,1302,1303,c02b,c02f_000a,000b,000d,0017,002b,0033,ff01_0403,0804,0401",
        "t13d0609h2_bcfe0a960bb4_f5e0aee4b195",
    );
}

/// TLS 1.2 only: no supported_versions (version from legacy_version), no SNI (`i`), no ALPN
/// (`00`), no signature_algorithms (no `_` after the extensions).
#[test]
fn tls12_without_sni_alpn_or_signature_algorithms() {
    let hello = from_records(
        &HelloBuilder::new(0x0303)
            .ciphers(&[0xc02f, 0x009c, 0x002f])
            .groups(&[0x0017])
            .point_formats(&[0, 1, 2])
            .ext(0x0023, &[])
            .ext(0x0005, &[1, 0, 0, 0, 0])
            .records(16_384),
    );
    assert_eq!(hello.sni, None);
    assert_fingerprints(
        &hello,
        "771,49199-156-47,10-11-35-5,23,0-1-2",
        "9adf2333e2d540a916de0f99509c5d00",
        "t12i030400_002f,009c,c02f_0005,000a,000b,0023",
        "t12i030400_f81807f6db74_5f6de69cbacb",
    );
}

/// A TLS 1.0 hello that ends after its compression methods: JA3's empty fields, JA4's zeroed `c`.
#[test]
fn no_extensions_block() {
    let hello =
        from_records(&HelloBuilder::new(0x0301).ciphers(&[0x0035, 0x002f, 0x000a]).no_extensions_block().records(7));
    assert_fingerprints(
        &hello,
        "769,53-47-10,,,",
        "d03688c92e36c87cd9bdbba5c3368d5b",
        "t10i030000_000a,002f,0035_",
        "t10i030000_5704bdfc91c6_000000000000",
    );
}

/// No cipher suites and only SNI and ALPN: both hashes zeroed; an ALPN protocol ending in a
/// non-alphanumeric byte (0x30 0xab) gives the first and last digits of its hex, `3b`.
#[test]
fn no_ciphers_only_sni_and_alpn_and_a_binary_alpn() {
    let hello = from_records(&HelloBuilder::new(0x0303).sni("a.b").alpn(&[&[0x30, 0xab], b"h2"]).records(1000));
    assert_eq!(hello.alpn.first().map(Vec::as_slice), Some(&[0x30, 0xab][..]));
    assert_fingerprints(
        &hello,
        "771,,0-16,,",
        "f56b0e56df61633726f096384b437677",
        "t12d00023b__",
        "t12d00023b_000000000000_000000000000",
    );
}

/// More than 99 cipher suites show as 99 (GREASE still not counted); SSL 3.0 is `s3`.
#[test]
fn counts_cap_at_99_and_ssl3_version() {
    let mut ciphers: Vec<u16> = (1..=120).collect();
    ciphers.insert(50, 0x2a2a);
    let hello = from_records(&HelloBuilder::new(0x0300).ciphers(&ciphers).no_extensions_block().records(64));
    assert_eq!(hello.cipher_suites.len(), 121);
    assert_eq!(hello.ja4(), "ts3i990000_0f8860b09f90_000000000000");
    assert_eq!(hello.ja3(), "d4e4eb8969ca95ce8501b6049f74b309");
}

/// JA4's version: supported_versions wins over legacy_version even when lower; GREASE in it is
/// ignored; an extension holding only GREASE falls back to legacy_version; unknown is `00`.
#[test]
fn ja4_version_choice() {
    let version = |legacy: u16, versions: Option<&[u16]>| {
        let mut builder = HelloBuilder::new(legacy).ciphers(&[0x1301]);
        if let Some(versions) = versions {
            builder = builder.versions(versions);
        }
        let ja4 = from_records(&builder.records(512)).ja4();
        ja4.get(1..3).unwrap().to_owned()
    };
    assert_eq!(version(0x0303, Some(&[0x0302, 0x0301])), "11");
    assert_eq!(version(0x0303, Some(&[0xfafa, 0x0304])), "13");
    assert_eq!(version(0x0301, Some(&[0x0a0a])), "10");
    assert_eq!(version(0x0302, None), "11");
    assert_eq!(version(0x0303, Some(&[0x0305])), "00");
    assert_eq!(version(0x0002, None), "s2");
}

/// ALPN: `http/1.1` gives `h1`, a one-character protocol is doubled, an empty first protocol or
/// an empty list is `00`; only the first protocol matters.
#[test]
fn alpn_characters() {
    let alpn = |protocols: &[&[u8]]| {
        let ja4 = from_records(&HelloBuilder::new(0x0303).alpn(protocols).records(512)).ja4();
        ja4.get(8..10).unwrap().to_owned()
    };
    assert_eq!(alpn(&[b"http/1.1", b"h2"]), "h1");
    assert_eq!(alpn(&[b"x"]), "xx");
    assert_eq!(alpn(&[b"", b"h2"]), "00");
    assert_eq!(alpn(&[]), "00");
    assert_eq!(alpn(&[&[0xba, 0xad]]), "bd");
}

/// Extension order changes JA3 but not JA4 (JA4 sorts; that is its point against permutation).
#[test]
fn extension_order_matters_to_ja3_only() {
    let hello = |order: [u16; 3]| {
        let mut builder = HelloBuilder::new(0x0303).ciphers(&[0x1301, 0x1302]);
        for ty in order {
            builder = builder.ext(ty, &[]);
        }
        from_records(&builder.records(512))
    };
    let (a, b) = (hello([0x0017, 0x0023, 0x0012]), hello([0x0012, 0x0017, 0x0023]));
    assert_ne!(a.ja3(), b.ja3());
    assert_eq!(a.ja4(), b.ja4());
    assert_eq!(a.ja4_raw(), "t12i020300_1301,1302_0012,0017,0023");
}
