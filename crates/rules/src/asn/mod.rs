//! The client's autonomous system: which AS announces an address, from a database file loaded
//! once (and swapped whole on reload by the caller, who holds it in an `Arc`).
//!
//! Two formats, told apart by content, not by file name:
//! - a MaxMind DB (`.mmdb`: GeoLite2-ASN, GeoIP2-ISP, or any database whose records carry
//!   `autonomous_system_number`), recognised by its metadata marker;
//! - an iptoasn.com TSV (`ip2asn-v4.tsv`, `ip2asn-v6.tsv`, `ip2asn-combined.tsv`): one range a line,
//!   `range_start<TAB>range_end<TAB>AS_number<TAB>country_code<TAB>AS_description`.
//!
//! AS 0 ("Not routed") is no AS: such addresses look up as `None`, like addresses the database
//! does not cover. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, as a dual-stack listener
//! reports IPv4 peers) is looked up as its IPv4 address in both formats.

mod mmdb;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod tsv;

use std::fmt::Write as _;
use std::io::Read as _;
use std::net::IpAddr;
use std::path::Path;

/// The largest file [`AsnDb::load`] accepts: the full iptoasn combined TSV is ~40 MiB and
/// GeoLite2-ASN ~10 MiB, so anything near this is not an ASN database (or is a mistake we would
/// rather refuse than hold in memory).
pub const MAX_FILE_BYTES: u64 = 512 * 1024 * 1024;

/// The MaxMind DB metadata marker; the spec puts its last occurrence within the final 128 KiB.
const MMDB_MARKER: &[u8] = b"\xAB\xCD\xEFMaxMind.com";
const MMDB_METADATA_MAX: usize = 128 * 1024;

/// An ASN database: which autonomous system announces an address.
#[derive(Debug)]
pub struct AsnDb {
    source: Source,
}

#[derive(Debug)]
enum Source {
    Tsv(tsv::Ranges),
    Mmdb(mmdb::Mmdb),
}

impl AsnDb {
    /// Loads `path`: a MaxMind-format database (`.mmdb`, e.g. GeoLite2-ASN; recognised by its
    /// metadata marker, not by the file name) or an iptoasn-style TSV (`range_start\trange_end\t
    /// AS_number\tcountry_code\tAS_description`, IPv4 and IPv6 ranges, as `ip2asn-v4.tsv` /
    /// `ip2asn-combined.tsv` from iptoasn.com). Files over [`MAX_FILE_BYTES`] are refused.
    ///
    /// # Errors
    /// The file cannot be read, is too large, is compressed, or does not parse; the message names
    /// the file, the line (TSV) and the reason.
    pub fn load(path: &Path) -> Result<AsnDb, String> {
        let origin = path.display().to_string();
        let bytes = read_bounded(path).map_err(|reason| format!("{origin}: {reason}"))?;
        // The marker first: an mmdb's first bytes are a tree node, which could be anything.
        if is_mmdb(&bytes) {
            return AsnDb::from_mmdb(bytes, &origin);
        }
        if bytes.starts_with(&[0x1f, 0x8b]) {
            // iptoasn serves its files gzipped; say so rather than "not UTF-8".
            return Err(format!("{origin}: the file is gzip-compressed; decompress it first (gunzip)"));
        }
        match String::from_utf8(bytes) {
            Ok(text) => AsnDb::from_tsv(&text, &origin),
            Err(error) => {
                let at = error.utf8_error().valid_up_to();
                let line = 1 + error.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
                Err(format!(
                    "{origin}: neither a MaxMind database (no metadata marker) nor a TSV text file \
                     (line {line}: the byte at offset {at} is not UTF-8)"
                ))
            }
        }
    }

    /// Parses TSV text (`origin` names it in errors). Blank lines and `#` comments are ignored;
    /// the ranges may come in any order, but may not overlap.
    ///
    /// # Errors
    /// `"{origin}: line N: reason"` for the first line that does not parse, or the two lines
    /// whose ranges overlap.
    pub fn from_tsv(text: &str, origin: &str) -> Result<AsnDb, String> {
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(format!("{origin}: {}", too_large(text.len() as u64)));
        }
        let ranges = tsv::Ranges::parse(text).map_err(|reason| format!("{origin}: {reason}"))?;
        Ok(AsnDb { source: Source::Tsv(ranges) })
    }

    /// Reads an mmdb image, refusing one whose records carry no `autonomous_system_number` (a
    /// City or Country database, say).
    ///
    /// # Errors
    /// `"{origin}: reason"` when the image is not a readable MaxMind database or not an ASN one.
    pub fn from_mmdb(bytes: Vec<u8>, origin: &str) -> Result<AsnDb, String> {
        let db = mmdb::Mmdb::new(bytes).map_err(|reason| format!("{origin}: {reason}"))?;
        Ok(AsnDb { source: Source::Mmdb(db) })
    }

    /// The AS number announcing `ip`, if any (AS 0 / "Not routed" is `None`). An IPv4-mapped
    /// IPv6 address (`::ffff:a.b.c.d`) is looked up as its IPv4 address. Allocates nothing, and
    /// a malformed database yields `None` rather than a panic.
    #[must_use]
    pub fn lookup(&self, ip: IpAddr) -> Option<u32> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        let asn = match &self.source {
            Source::Tsv(ranges) => ranges.lookup(ip),
            Source::Mmdb(db) => db.lookup(ip),
        };
        asn.filter(|&asn| asn != 0)
    }

    /// What was loaded, for a log line: `"12,345 ranges (TSV: 12,000 IPv4, 345 IPv6)"` or
    /// `"GeoLite2-ASN (mmdb, 1,234,567 nodes, built 2026-11-01)"`.
    #[must_use]
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Tsv(ranges) => {
                let (v4, v6) = ranges.counts();
                format!(
                    "{} ranges (TSV: {} IPv4, {} IPv6)",
                    thousands(v4 as u64 + v6 as u64),
                    thousands(v4 as u64),
                    thousands(v6 as u64)
                )
            }
            Source::Mmdb(db) => db.describe(),
        }
    }
}

/// Reads at most [`MAX_FILE_BYTES`] (+1, to tell "at the limit" from "over it", whatever the
/// metadata said: the file may grow while we read it).
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let size = file.metadata().map_err(|e| format!("cannot stat: {e}"))?.len();
    if size > MAX_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

fn too_large(size: u64) -> String {
    format!("{size} bytes is over the limit of {MAX_FILE_BYTES} bytes (512 MiB)")
}

/// Whether the file ends with a MaxMind metadata section. The marker's first byte (0xAB) is never
/// valid on its own in UTF-8, so no TSV text can be mistaken for one.
fn is_mmdb(bytes: &[u8]) -> bool {
    let tail = &bytes[bytes.len().saturating_sub(MMDB_METADATA_MAX)..];
    tail.windows(MMDB_MARKER.len()).any(|window| window == MMDB_MARKER)
}

/// `1234567` as `"1,234,567"`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `YYYY-MM-DD` (UTC) of a Unix time, without a date library: the days-to-civil conversion of
/// the proleptic Gregorian calendar (Howard Hinnant's algorithm).
fn utc_date(epoch_seconds: u64) -> String {
    let days = i64::try_from(epoch_seconds / 86_400).unwrap_or(i64::MAX / 2) + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let mut out = String::with_capacity(10);
    let _ = write!(out, "{year:04}-{month:02}-{day:02}");
    out
}

#[cfg(test)]
mod tests {
    use super::{thousands, utc_date};

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_793_491_200), "2026-11-01");
        assert_eq!(utc_date(1_704_067_199), "2023-12-31");
    }
}
