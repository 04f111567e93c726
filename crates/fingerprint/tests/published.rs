//! Fingerprints published by others, for ClientHellos captured from real clients.
//!
//! Sources:
//! - JA3 README (github.com/salesforce/ja3, "How it works"): two JA3 strings and their MD5.
//! - JA4 technical details (github.com/FoxIO-LLC/ja4, technical_details/JA4.md, "Example" and
//!   "Raw Output"): the lists of a Chrome ClientHello, its `JA4_r` and `JA4`.
//! - FoxIO-LLC/ja4's test captures (`pcap/*.pcap*`) and the fingerprints its Python tool
//!   publishes for them (`python/test/testdata/<capture>.json`, fields `JA4.1` and `JA4_r.1`,
//!   repository snapshot of 2026-06 at 0e54bc8). The client's first TCP bytes (its TLS records
//!   up to the end of the ClientHello) were cut out of each capture into `tests/data/foxio-*.hex`.
//!   Their JA3s are not published there; the ones below are Wireshark 4.0.17's own JA3
//!   (`tshark -e tls.handshake.ja3`), an independent implementation, on the same captures.
//! - open-ch/ja3 (github.com/open-ch/ja3, `ja3_test.go`, "Sanity check"): a ClientHello to
//!   www.google.ch as raw bytes (`tests/data/opench-ja3-google-ch.hex`), its JA3 string and MD5.

mod common;

use tollgate_fingerprint::{ClientHello, client_hello_from_records};

fn md5_of_ja3_string(ja3_string: &str) -> String {
    // JA3 is the MD5 of its string: build a hello whose string is `ja3_string`.
    let mut fields = ja3_string.split(',');
    let mut list = || -> Vec<u16> {
        fields.next().unwrap().split('-').filter(|v| !v.is_empty()).map(|v| v.parse().unwrap()).collect()
    };
    let legacy_version = list()[0];
    let (cipher_suites, extensions, supported_groups) = (list(), list(), list());
    let ec_point_formats = list().into_iter().map(|v| u8::try_from(v).unwrap()).collect();
    let hello = ClientHello {
        legacy_version,
        cipher_suites,
        extensions,
        supported_groups,
        ec_point_formats,
        ..Default::default()
    };
    assert_eq!(hello.ja3_string(), ja3_string);
    hello.ja3()
}

#[test]
fn ja3_readme_examples() {
    assert_eq!(
        md5_of_ja3_string("769,47-53-5-10-49161-49162-49171-49172-50-56-19-4,0-10-11,23-24-25,0"),
        "ada70206e40642a3e4461f35503241d5"
    );
    assert_eq!(md5_of_ja3_string("769,4-5-10-9-100-98-3-6-19-18-99,,,"), "de350869b8c85de67a350c8d186f11e6");
}

/// The JA4 spec's example hello, from its `JA4_ro` (original order, SNI and ALPN kept).
#[test]
fn ja4_spec_example() {
    let hello = ClientHello {
        legacy_version: 0x0303,
        cipher_suites: vec![
            0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d,
            0x002f, 0x0035,
        ],
        extensions: vec![
            0x001b, 0x0000, 0x0033, 0x0010, 0x4469, 0x0017, 0x002d, 0x000d, 0x0005, 0x0023, 0x0012, 0x002b, 0xff01,
            0x000b, 0x000a, 0x0015,
        ],
        signature_algorithms: vec![0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601],
        alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        supported_versions: vec![0x0304, 0x0303],
        sni: Some("example.com".to_owned()),
        ..Default::default()
    };
    assert_eq!(
        hello.ja4_raw(),
        "t13d1516h2_002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_0005,000a,000b,000d,0012,\
         0015,0017,001b,0023,002b,002d,0033,4469,ff01_0403,0804,0401,0503,0805,0501,0806,0601"
    );
    assert_eq!(hello.ja4(), "t13d1516h2_8daaf6152771_e5627efa2ab1");
    // "If there are no signature algorithms in the hello packet, then the string ends without an
    // underscore": the spec gives that hash too.
    let without_signature_algorithms = ClientHello { signature_algorithms: Vec::new(), ..hello };
    assert_eq!(without_signature_algorithms.ja4(), "t13d1516h2_8daaf6152771_6d807ffa2a79");
}

/// A captured client's records, parsed whole, and parsed again one byte at a time (each prefix
/// must ask for more bytes).
fn captured(hex: &str) -> ClientHello {
    let bytes = common::hex(hex);
    for end in 0..bytes.len() {
        assert_eq!(client_hello_from_records(&bytes[..end]), Ok(None), "prefix of {end} bytes");
    }
    client_hello_from_records(&bytes).unwrap().unwrap()
}

/// Firefox, TLS 1.3 (pcap/tls12.pcap, stream 0, SNI contile.services.mozilla.com).
#[test]
fn foxio_firefox_tls13() {
    let hello = captured(include_str!("data/foxio-tls12.hex"));
    assert_eq!(hello.sni.as_deref(), Some("contile.services.mozilla.com"));
    assert_eq!(hello.ja4(), "t13d1715h2_5b57614c22b0_3d5424432f57");
    assert_eq!(
        hello.ja4_raw(),
        "t13d1715h2_002f,0035,009c,009d,1301,1302,1303,c009,c00a,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_0005,000a,000b,\
         000d,0015,0017,001c,0022,0023,002b,002d,0033,ff01_0403,0503,0603,0804,0805,0806,0401,0501,0601,0203,0201"
    );
    assert_eq!(
        hello.ja3_string(),
        "771,4865-4867-4866-49195-49199-52393-52392-49196-49200-49162-49161-49171-49172-156-157-47-53,\
         0-23-65281-10-11-35-16-5-34-51-43-13-45-28-21,29-23-24-25-256-257,0"
    );
    assert_eq!(hello.ja3(), "579ccef312d18482fc42e2b822ca2430");
}

/// A TLS 1.2 client offering 46 suites (pcap/tls-alpn-h2.pcap, stream 0, www.cloudflare.com).
#[test]
fn foxio_tls12_alpn_h2() {
    let hello = captured(include_str!("data/foxio-tls-alpn-h2.hex"));
    assert_eq!(hello.ja4(), "t12d4605h2_85626a9a5f7f_aaf95bb78ec9");
    assert_eq!(
        hello.ja4_raw(),
        "t12d4605h2_0004,0005,000a,0016,002f,0033,0035,0039,003c,003d,0041,0045,0067,006b,0081,0084,0088,009c,009d,009e,\
         009f,00ba,00be,00c0,00c4,00ff,c007,c008,c009,c00a,c011,c012,c013,c014,c023,c024,c027,c028,c02b,c02c,c02f,c030,\
         cca8,cca9,ccaa,ff85_000a,000b,000d_0601,0603,efef,0501,0503,0401,0403,eeee,eded,0301,0303,0201,0203"
    );
    assert_eq!(hello.ja3(), "3faa4ad39f690c4ef1c3160caa375465");
}

/// A TLS 1.2 client without ALPN (pcap/latest.pcapng, stream 3, discovery.cem.cloud.us).
#[test]
fn foxio_tls12_without_alpn() {
    let hello = captured(include_str!("data/foxio-latest-stream3.hex"));
    assert_eq!(hello.ja4(), "t12d190800_d83cc789557e_7af1ed941c26");
    assert_eq!(
        hello.ja4_raw(),
        "t12d190800_000a,002f,0035,003c,003d,009c,009d,c009,c00a,c013,c014,c023,c024,c027,c028,c02b,c02c,c02f,c030_0005,\
         000a,000b,000d,0017,0023,ff01_0804,0805,0806,0401,0501,0201,0403,0503,0203,0202,0601,0603"
    );
    assert_eq!(hello.ja3(), "a0e9f5d64349fb13191bc781f81f42e1");
}

/// Chrome with GREASE (pcap/badcurveball.pcap, stream 0, bad.curveballtest.com).
#[test]
fn foxio_chrome_with_grease() {
    let hello = captured(include_str!("data/foxio-badcurveball.hex"));
    assert!(hello.cipher_suites.first().is_some_and(|&c| c & 0x0f0f == 0x0a0a), "GREASE first, as Chrome sends");
    assert_eq!(hello.ja4(), "t13d1615h2_46e7e9700bed_45f260be83e2");
    assert_eq!(
        hello.ja4_raw(),
        "t13d1615h2_000a,002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_0005,000a,000b,000d,\
         0012,0015,0017,001b,0023,002b,002d,0033,ff01_0403,0804,0401,0503,0805,0501,0806,0601,0201"
    );
    assert_eq!(hello.ja3(), "66918128f1b9b03303d77c6f2eefd128");
}

/// Chrome whose first ALPN protocol is the bytes 0xba 0xad (pcap/tls-non-ascii-alpn.pcapng,
/// stream 0). FoxIO's tools published `t13d151699_…`: they still print `99` for a protocol that
/// starts with a non-ASCII byte, the rule of older spec versions. The current spec (ALPN Extension
/// Value: "the first and last characters of the hex representation") gives `bd`; the hashed
/// parts are the published ones.
#[test]
fn foxio_non_ascii_alpn() {
    let hello = captured(include_str!("data/foxio-tls-non-ascii-alpn.hex"));
    assert_eq!(hello.alpn.first().map(Vec::as_slice), Some(&[0xba, 0xad][..]));
    let published = "t13d151699_8daaf6152771_e5627efa2ab1";
    assert_eq!(hello.ja4(), published.replace("99_", "bd_"));
    assert_eq!(hello.ja4().get(10..), published.get(10..));
    assert_eq!(hello.ja3(), "1c258ebef8eee2dfa3df6d8d07285af9");
}

#[test]
fn opench_google_ch() {
    let hello = captured(include_str!("data/opench-ja3-google-ch.hex"));
    assert_eq!(hello.sni.as_deref(), Some("www.google.ch"));
    assert_eq!(
        hello.ja3_string(),
        "771,49200-49196-49199-49195-49172-49162-49171-49161-159-158-57-51-157-156-53-47-10-255,\
         0-11-10-35-13-5-15-13172,23-25-28-27-24-26-22-14-13-11-12-9-10,0-1-2"
    );
    assert_eq!(hello.ja3(), "5e647d60a56d199388ae462b75b3cdad");
}
