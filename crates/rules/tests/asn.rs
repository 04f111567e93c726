//! The ASN database: TSV and MaxMind files (built here by the testkit), lookups at range
//! boundaries, IPv4-mapped addresses, AS 0, and precise refusals of bad or foreign files.

use std::net::IpAddr;
use std::path::PathBuf;

use tollgate_rules::AsnDb;
use tollgate_rules::asn::testkit::{self, Value, Writer};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The same ranges in both formats: `(first, last, asn, organisation)`, each an exact CIDR block
/// so that `testkit::mmdb` can take it too.
const RANGES: &[(&str, &str, &str, u32, &str)] = &[
    ("198.51.100.0/24", "198.51.100.0", "198.51.100.255", 64_500, "EXAMPLE-NET"),
    ("203.0.113.0/25", "203.0.113.0", "203.0.113.127", 64_501, "LOWER-HALF"),
    ("203.0.113.128/25", "203.0.113.128", "203.0.113.255", 64_502, "UPPER-HALF"),
    ("192.0.2.0/24", "192.0.2.0", "192.0.2.255", 0, "Not routed"),
    ("0.0.0.0/32", "0.0.0.0", "0.0.0.0", 64_510, "FIRST-ADDRESS"),
    ("255.255.255.255/32", "255.255.255.255", "255.255.255.255", 64_511, "LAST-ADDRESS"),
    ("2001:db8::/32", "2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 4_200_000_000, "DOC-V6"),
    ("2001:db9::/48", "2001:db9::", "2001:db9:0:ffff:ffff:ffff:ffff:ffff", 65_551, "NEXT-V6"),
];

/// `(address, expected)`: every range's first and last address, and the ones just outside.
const CASES: &[(&str, Option<u32>)] = &[
    ("198.51.99.255", None),
    ("198.51.100.0", Some(64_500)),
    ("198.51.100.77", Some(64_500)),
    ("198.51.100.255", Some(64_500)),
    ("198.51.101.0", None),
    ("203.0.112.255", None),
    ("203.0.113.0", Some(64_501)),
    ("203.0.113.127", Some(64_501)),
    ("203.0.113.128", Some(64_502)),
    ("203.0.113.255", Some(64_502)),
    ("203.0.114.0", None),
    ("192.0.2.1", None), // AS 0: not routed
    ("0.0.0.0", Some(64_510)),
    ("0.0.0.1", None),
    ("255.255.255.254", None),
    ("255.255.255.255", Some(64_511)),
    // IPv4-mapped IPv6 addresses are their IPv4 address.
    ("::ffff:198.51.100.0", Some(64_500)),
    ("::ffff:203.0.113.200", Some(64_502)),
    ("::ffff:198.51.101.0", None),
    ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("2001:db8::", Some(4_200_000_000)),
    ("2001:db8:1234::1", Some(4_200_000_000)),
    ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", Some(4_200_000_000)),
    ("2001:db9::", Some(65_551)),
    ("2001:db9:0:ffff:ffff:ffff:ffff:ffff", Some(65_551)),
    ("2001:db9:1::", None),
    ("::1", None),
];

fn tsv_db() -> AsnDb {
    let rows: Vec<_> = RANGES.iter().map(|&(_, first, last, asn, org)| (first, last, asn, "ZZ", org)).collect();
    AsnDb::from_tsv(&testkit::tsv(&rows), "ranges.tsv").unwrap()
}

fn mmdb_db() -> AsnDb {
    let entries: Vec<_> = RANGES.iter().map(|&(cidr, _, _, asn, org)| (cidr, asn, org)).collect();
    AsnDb::from_mmdb(testkit::mmdb(&entries), "ranges.mmdb").unwrap()
}

fn check(db: &AsnDb, what: &str) {
    for &(address, expected) in CASES {
        assert_eq!(db.lookup(ip(address)), expected, "{what}: {address}");
    }
}

/// A file under the target dir's scratch space for integration tests.
fn scratch(name: &str, contents: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("asn-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn the_database_can_be_shared_across_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<AsnDb>();
}

#[test]
fn tsv_lookups_at_range_boundaries_v4_v6_and_mapped() {
    let db = tsv_db();
    check(&db, "TSV");
    assert_eq!(db.describe(), "7 ranges (TSV: 5 IPv4, 2 IPv6)", "AS 0 ranges are not kept");
}

#[test]
fn mmdb_lookups_agree_with_tsv() {
    let db = mmdb_db();
    check(&db, "mmdb");
    let described = db.describe();
    assert!(
        described.starts_with("GeoLite2-ASN (mmdb, ") && described.ends_with(" nodes, built 2026-01-01)"),
        "{described}"
    );
}

#[test]
fn the_testkit_writes_databases_the_reference_reader_verifies() {
    // Strings of every size class (1-byte, 29+, 285+, 65,821+) and the other types in one record.
    let mut writer = Writer::new("Test-ASN").built_at(1_793_491_200);
    // Later entries win: the blocks below split this one.
    writer.insert("::/0", Value::asn(1, "EVERYTHING-ELSE"));
    for (cidr, length) in [("10.0.0.0/8", 5), ("11.0.0.0/8", 100), ("12.0.0.0/8", 1_000), ("13.0.0.0/8", 70_000)] {
        writer.insert(
            cidr,
            Value::map([
                ("autonomous_system_number", Value::U32(u32::try_from(length).unwrap())),
                ("autonomous_system_organization", Value::Str("x".repeat(length))),
                ("extras", Value::Array(vec![Value::U16(7), Value::U64(u64::MAX), Value::map([])])),
            ]),
        );
    }
    writer.insert("10.1.0.0/16", Value::asn(2, "OVERRIDES-PART-OF-10/8"));
    let bytes = writer.build();
    let reader = maxminddb::Reader::from_source(bytes.clone()).unwrap();
    reader.verify().unwrap();
    assert_eq!(reader.metadata().database_type, "Test-ASN");

    let db = AsnDb::from_mmdb(bytes, "test").unwrap();
    assert_eq!(db.lookup(ip("10.0.0.1")), Some(5));
    assert_eq!(db.lookup(ip("10.1.2.3")), Some(2));
    assert_eq!(db.lookup(ip("11.255.255.255")), Some(100));
    assert_eq!(db.lookup(ip("12.0.0.0")), Some(1_000));
    assert_eq!(db.lookup(ip("13.1.1.1")), Some(70_000));
    assert_eq!(db.lookup(ip("2001:db8::1")), Some(1));
    assert!(db.describe().ends_with("built 2026-11-01)"), "{}", db.describe());
}

#[test]
fn tsv_comments_blank_lines_crlf_as_prefixes_and_unsorted_ranges() {
    let text = "# ip2asn test\r\n\r\n\
                10.0.0.0\t10.0.0.255\tAS64500\tZZ\tLATER-IN-ORDER\r\n\
                   # indented comment\n\
                1.0.0.0\t1.0.0.255\t13335\n\
                ::\t1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff\t0\tNone\tNot routed\n\
                2000::\t2000::ffff\t64501\tZZ\tdescription with spaces\n";
    let db = AsnDb::from_tsv(text, "t.tsv").unwrap();
    assert_eq!(db.lookup(ip("10.0.0.128")), Some(64_500));
    assert_eq!(db.lookup(ip("1.0.0.1")), Some(13_335));
    assert_eq!(db.lookup(ip("::5")), None);
    assert_eq!(db.lookup(ip("2000::ff")), Some(64_501));
    assert_eq!(db.describe(), "3 ranges (TSV: 2 IPv4, 1 IPv6)");
    assert_eq!(AsnDb::from_tsv("# nothing\n\n", "empty.tsv").unwrap().lookup(ip("1.1.1.1")), None);
}

#[test]
fn tsv_errors_name_the_origin_the_line_and_the_reason() {
    let cases = [
        ("1.0.0.0\t1.0.0.255\n", "t.tsv: line 1: expected range_start<TAB>range_end<TAB>AS_number"),
        ("1.0.0.0 1.0.0.255 13335 US X\n", "found 1 tab-separated field(s)"),
        ("# c\n1.0.0\t1.0.0.255\t1\n", "t.tsv: line 2: range_start \"1.0.0\" is not an IP address"),
        ("1.0.0.0\tnope\t1\n", "line 1: range_end \"nope\" is not an IP address"),
        ("1.0.0.9\t1.0.0.1\t1\n", "line 1: range_start 1.0.0.9 is after range_end 1.0.0.1"),
        ("1.0.0.0\t::1\t1\n", "line 1: range_start 1.0.0.0 and range_end ::1 are not of the same IP version"),
        ("1.0.0.0\t1.0.0.1\t-1\n", "line 1: AS_number \"-1\" is not a number in 0..=4294967295"),
        ("1.0.0.0\t1.0.0.1\t4294967296\n", "line 1: AS_number \"4294967296\" is not a number"),
        ("1.0.0.0\t1.0.0.1\t\tUS\tX\n", "line 1: AS_number \"\" is not a number"),
        (
            "1.0.0.0\t1.0.0.255\t1\n\n2.0.0.0\t2.0.0.9\t2\n1.0.0.255\t1.0.1.0\t3\n",
            "t.tsv: line 4: range 1.0.0.255-1.0.1.0 overlaps line 1's range 1.0.0.0-1.0.0.255",
        ),
        // A not-routed range may not overlap a routed one either.
        (
            "2001::\t2001::ff\t0\n2001::80\t2001::80\t5\n",
            "line 2: range 2001::80-2001::80 overlaps line 1's range 2001::-2001::ff",
        ),
        ("1.0.0.0\t1.0.0.0\t1\n1.0.0.0\t1.0.0.0\t1\n", "line 2: range 1.0.0.0-1.0.0.0 overlaps line 1's"),
    ];
    for (text, expected) in cases {
        let error = AsnDb::from_tsv(text, "t.tsv").unwrap_err();
        assert!(error.contains(expected), "{text:?}: {error:?} lacks {expected:?}");
    }
}

#[test]
fn load_tells_the_formats_apart_by_content_not_by_name() {
    let entries: Vec<_> = RANGES.iter().map(|&(cidr, _, _, asn, org)| (cidr, asn, org)).collect();
    let mmdb_named_tsv = scratch("really-an-mmdb.tsv", &testkit::mmdb(&entries));
    check(&AsnDb::load(&mmdb_named_tsv).unwrap(), "mmdb file named .tsv");

    let rows: Vec<_> = RANGES.iter().map(|&(_, first, last, asn, org)| (first, last, asn, "ZZ", org)).collect();
    let tsv_named_mmdb = scratch("really-a-tsv.mmdb", testkit::tsv(&rows).as_bytes());
    check(&AsnDb::load(&tsv_named_mmdb).unwrap(), "TSV file named .mmdb");
}

#[test]
fn load_errors_name_the_file_and_the_reason() {
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("asn-tests/no-such-file.tsv");
    let error = AsnDb::load(&missing).unwrap_err();
    assert!(error.starts_with(&format!("{}: cannot open: ", missing.display())), "{error}");

    let bad_line = scratch("bad-line.tsv", b"1.0.0.0\t1.0.0.255\t1\tUS\tX\n1.0.1.0\t1.0.1.255\tAS?\tUS\tY\n");
    let error = AsnDb::load(&bad_line).unwrap_err();
    assert_eq!(error, format!("{}: line 2: AS_number \"AS?\" is not a number in 0..=4294967295", bad_line.display()));

    let gzip = scratch("ip2asn-v4.tsv.gz", &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]);
    assert!(AsnDb::load(&gzip).unwrap_err().ends_with("gzip-compressed; decompress it first (gunzip)"));

    let binary = scratch("binary.bin", b"1.0.0.0\t1.0.0.255\t1\n\xff\xfe\n");
    let error = AsnDb::load(&binary).unwrap_err();
    assert!(error.contains("neither a MaxMind database") && error.contains("line 2"), "{error}");
}

#[test]
fn load_refuses_a_file_over_the_size_limit_without_reading_it() {
    let path = scratch("huge.tsv", b"");
    // Sparse: no disk is used, and the size check comes before any read.
    std::fs::File::options().write(true).open(&path).unwrap().set_len(tollgate_rules::asn::MAX_FILE_BYTES + 1).unwrap();
    let error = AsnDb::load(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(error, format!("{}: 536870913 bytes is over the limit of 536870912 bytes (512 MiB)", path.display()));
}

#[test]
fn a_database_without_asns_is_refused() {
    let mut city = Writer::new("GeoIP2-City");
    city.insert("198.51.100.0/24", Value::map([("country", Value::map([("iso_code", Value::Str("DE".into()))]))]));
    let error = AsnDb::from_mmdb(city.build(), "City.mmdb").unwrap_err();
    assert_eq!(
        error,
        "City.mmdb: not an ASN database: its type is \"GeoIP2-City\" and none of the first 1 records carries \
         autonomous_system_number"
    );

    // The type alone does not make it an ASN database when the records say otherwise.
    let mut ipinfo_like = Writer::new("ipinfo ASN");
    ipinfo_like.insert("198.51.100.0/24", Value::map([("asn", Value::Str("AS64500".into()))]));
    assert!(AsnDb::from_mmdb(ipinfo_like.build(), "asn.mmdb").unwrap_err().contains("not an ASN database"));

    // A field of the wrong type.
    let mut stringly = Writer::new("GeoLite2-ASN");
    stringly.insert("198.51.100.0/24", Value::map([("autonomous_system_number", Value::Str("64500".into()))]));
    let error = AsnDb::from_mmdb(stringly.build(), "s.mmdb").unwrap_err();
    assert!(error.starts_with("s.mmdb: not an ASN database: a record does not decode as one: "), "{error}");

    // No records at all: an ASN database that happens to be empty is fine, an empty City is not.
    let empty = AsnDb::from_mmdb(Writer::new("GeoLite2-ASN").build(), "e.mmdb").unwrap();
    assert_eq!(empty.lookup(ip("198.51.100.1")), None);
    let error = AsnDb::from_mmdb(Writer::new("GeoIP2-City").build(), "c.mmdb").unwrap_err();
    assert!(error.contains("its type is \"GeoIP2-City\" and no record carries"), "{error}");
}

#[test]
fn a_truncated_or_foreign_mmdb_is_refused_at_load() {
    let entries: Vec<_> = RANGES.iter().map(|&(cidr, _, _, asn, org)| (cidr, asn, org)).collect();
    let bytes = testkit::mmdb(&entries);
    for len in 0..bytes.len() {
        // Whatever survives the cut must not panic on lookups either.
        if let Ok(db) = AsnDb::from_mmdb(bytes[..len].to_vec(), "cut.mmdb") {
            for &(address, _) in CASES {
                let _ = db.lookup(ip(address));
            }
        }
    }
    let error = AsnDb::from_mmdb(bytes[..bytes.len() / 2].to_vec(), "cut.mmdb").unwrap_err();
    assert!(error.starts_with("cut.mmdb: not a readable MaxMind database: "), "{error}");
    assert!(AsnDb::from_mmdb(b"hello".to_vec(), "hello").is_err());
}

mod differential {
    //! Random non-overlapping ranges (adjacent ones, single addresses and AS 0 included), written
    //! as TSV in shuffled order and as an mmdb: both must agree with a linear scan, at every
    //! range's boundaries and at random addresses.

    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;
    use tollgate_rules::AsnDb;
    use tollgate_rules::asn::testkit;

    /// Inclusive `(start, end, asn)` ranges from sorted cut points: each gap between two cuts is
    /// a range or left empty, so ranges touch, are separated, or are one address wide.
    fn ranges(cuts: Vec<u128>, chosen: &[Option<u32>]) -> Vec<(u128, u128, u32)> {
        let mut cuts = cuts;
        cuts.sort_unstable();
        cuts.dedup();
        cuts.windows(2).zip(chosen).filter_map(|(pair, asn)| asn.map(|asn| (pair[0], pair[1] - 1, asn))).collect()
    }

    fn asn() -> impl Strategy<Value = Option<u32>> {
        prop_oneof![2 => Just(None), 1 => Just(Some(0)), 6 => (1..=u32::MAX).prop_map(Some)]
    }

    fn v4(n: u128) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap()))
    }

    /// IPv6 ranges live in `2000::/8`, away from the IPv4 space under `::/96`.
    fn v6(n: u128) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from((0x20u128 << 120) | n))
    }

    fn naive(ranges: &[(u128, u128, u32)], x: u128) -> Option<u32> {
        ranges.iter().find(|&&(start, end, _)| start <= x && x <= end).map(|&(_, _, asn)| asn).filter(|&asn| asn != 0)
    }

    /// Every boundary address of every range, one off on each side, and the extra probes.
    fn probes(ranges: &[(u128, u128, u32)], max: u128, extra: &[u128]) -> Vec<u128> {
        let mut out: Vec<u128> = extra.iter().map(|x| x & max).collect();
        for &(start, end, _) in ranges {
            out.extend([start.saturating_sub(1), start, start + 1, end.saturating_sub(1), end, end.saturating_add(1)]);
        }
        out.into_iter().filter(|&x| x <= max).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn tsv_and_mmdb_agree_with_a_linear_scan(
            cuts4 in prop::collection::vec(prop_oneof![0..=u128::from(u32::MAX), 0u128..64, Just(0), Just(u128::from(u32::MAX))], 2..24),
            asns4 in prop::collection::vec(asn(), 24),
            cuts6 in prop::collection::vec(prop_oneof![0..(1u128 << 120), 0u128..1024], 2..12),
            asns6 in prop::collection::vec(asn(), 12),
            extra in prop::collection::vec(any::<u128>(), 32),
            seed in any::<u64>(),
        ) {
            // The last cut is one past a range's end; let a v4 range reach 255.255.255.255 too.
            let mut cuts4 = cuts4;
            if seed % 4 == 0 {
                cuts4.push(1 << 32);
            }
            let ranges4 = ranges(cuts4, &asns4);
            let ranges6 = ranges(cuts6, &asns6);

            let mut rows: Vec<(String, String, u32)> = ranges4.iter().map(|&(s, e, a)| (v4(s).to_string(), v4(e).to_string(), a))
                .chain(ranges6.iter().map(|&(s, e, a)| (v6(s).to_string(), v6(e).to_string(), a)))
                .collect();
            // TSV input need not be sorted: rotate the rows by a random amount, IPv6 first.
            if !rows.is_empty() {
                let by = usize::try_from(seed % rows.len() as u64).unwrap();
                rows.rotate_left(by);
            }
            let rows: Vec<_> = rows.iter().map(|(s, e, a)| (s.as_str(), e.as_str(), *a, "ZZ", "ORG")).collect();
            let tsv = AsnDb::from_tsv(&testkit::tsv(&rows), "random.tsv").unwrap();
            // Accepted even with no ranges (its type says ASN) or only AS 0 ones (they carry the field).
            let mmdb = AsnDb::from_mmdb(testkit::mmdb_ranges(&rows), "random.mmdb").unwrap();

            for x in probes(&ranges4, u128::from(u32::MAX), &extra) {
                let expected = naive(&ranges4, x);
                prop_assert_eq!(tsv.lookup(v4(x)), expected, "TSV {}", v4(x));
                prop_assert_eq!(mmdb.lookup(v4(x)), expected, "mmdb {}", v4(x));
                let mapped = match v4(x) { IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()), v6 => v6 };
                prop_assert_eq!(tsv.lookup(mapped), expected, "TSV {}", mapped);
                prop_assert_eq!(mmdb.lookup(mapped), expected, "mmdb {}", mapped);
            }
            for x in probes(&ranges6, (1u128 << 120) - 1, &extra) {
                let expected = naive(&ranges6, x);
                prop_assert_eq!(tsv.lookup(v6(x)), expected, "TSV {}", v6(x));
                prop_assert_eq!(mmdb.lookup(v6(x)), expected, "mmdb {}", v6(x));
            }
        }

        #[test]
        fn a_corrupt_mmdb_is_refused_or_looks_up_without_panicking(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            probes in prop::collection::vec(any::<u128>(), 16),
        ) {
            let mut bytes = testkit::mmdb(&[
                ("198.51.100.0/24", 64_500, "A"),
                ("203.0.113.0/25", 64_501, "B"),
                ("2001:db8::/32", 64_502, "C"),
            ]);
            for (at, byte) in flips {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            if let Ok(db) = AsnDb::from_mmdb(bytes, "corrupt.mmdb") {
                for x in probes {
                    let _ = db.lookup(IpAddr::V6(Ipv6Addr::from(x)));
                    let _ = db.lookup(v4(x & u128::from(u32::MAX)));
                }
                let _ = db.describe();
            }
        }
    }
}
