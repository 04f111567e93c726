//! iptoasn.com's TSV: `range_start<TAB>range_end<TAB>AS_number<TAB>country_code<TAB>AS_description`,
//! inclusive ranges of IPv4 or IPv6 addresses. Only the first three fields are read (the country
//! and description may be missing); `AS_number` may be written `AS13335` too.
//!
//! Overlapping ranges are refused (which AS would an address in both belong to?), naming both
//! lines; unsorted input is sorted. AS 0 ranges ("Not routed") take part in the overlap check,
//! then are dropped: an address in one looks up as `None`, like one in no range.
//!
//! Lookups bisect two sorted tables (IPv4 as `u32`, IPv6 as `u128`), allocating nothing. A full
//! table (500,000 IPv4 ranges) is megabytes, past the CPU caches, so an index by the address's top
//! 16 bits first narrows the search to the few ranges starting in its /16: a lookup touches a few
//! cache lines instead of ~20 (random addresses over 500,000 ranges: 125 ns instead of 550 ns).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The IPv4 and IPv6 ranges of one file.
pub(super) struct Ranges {
    v4: Table<u32>,
    v6: Table<u128>,
}

impl fmt::Debug for Ranges {
    // Not the ranges themselves: a full database has a million of them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ranges").field("v4", &self.v4.len()).field("v6", &self.v6.len()).finish()
    }
}

/// How many buckets the index has: one per value of an address's top 16 bits.
const BUCKETS: usize = 1 << 16;

/// An address as a sortable integer, with its index bucket.
trait Address: Copy + Ord {
    /// The top 16 bits.
    fn bucket(self) -> usize;
}

impl Address for u32 {
    fn bucket(self) -> usize {
        let [a, b, ..] = self.to_be_bytes();
        usize::from(u16::from_be_bytes([a, b]))
    }
}

impl Address for u128 {
    fn bucket(self) -> usize {
        let [a, b, ..] = self.to_be_bytes();
        usize::from(u16::from_be_bytes([a, b]))
    }
}

/// Non-overlapping ranges sorted by start; `starts` apart from the rest so that the bisection
/// walks a dense array of keys.
struct Table<A> {
    starts: Box<[A]>,
    /// `(end, asn)` of the range starting at the same index.
    ends: Box<[(A, u32)]>,
    /// `index[b]`: how many ranges start in a bucket before `b` (`BUCKETS + 1` entries), so the
    /// ranges starting in bucket `b` are `starts[index[b]..index[b + 1]]`.
    index: Box<[u32]>,
}

impl<A: Address> Table<A> {
    fn new(starts: Box<[A]>, ends: Box<[(A, u32)]>) -> Result<Table<A>, String> {
        let mut index = Vec::with_capacity(BUCKETS + 1);
        let mut before = 0;
        for bucket in 0..=BUCKETS {
            while starts.get(before).is_some_and(|start| start.bucket() < bucket) {
                before += 1;
            }
            index.push(u32::try_from(before).map_err(|_| format!("more than {} ranges", u32::MAX))?);
        }
        Ok(Table { starts, ends, index: index.into_boxed_slice() })
    }

    fn len(&self) -> usize {
        self.starts.len()
    }

    fn lookup(&self, address: A) -> Option<u32> {
        let bucket = address.bucket();
        let (first, end) = (*self.index.get(bucket)? as usize, *self.index.get(bucket + 1)? as usize);
        // The last range starting at or before the address is the only one that can hold it: one
        // starting in this bucket, or else the last one before it (which may reach into it).
        let after = first + self.starts.get(first..end)?.partition_point(|&start| start <= address);
        let (end, asn) = *self.ends.get(after.checked_sub(1)?)?;
        (address <= end).then_some(asn)
    }
}

/// One parsed line, before sorting: its number is kept for the overlap error.
#[derive(Clone, Copy)]
struct Row<A> {
    start: A,
    end: A,
    asn: u32,
    line: usize,
}

impl Ranges {
    /// Parses the whole text: `Err("line N: reason")` on the first bad line or overlap.
    pub(super) fn parse(text: &str) -> Result<Ranges, String> {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (start, end, asn) = parse_line(line).map_err(|reason| format!("line {number}: {reason}"))?;
            match (start, end) {
                (IpAddr::V4(start), IpAddr::V4(end)) => {
                    v4.push(Row { start: u32::from(start), end: u32::from(end), asn, line: number });
                }
                (IpAddr::V6(start), IpAddr::V6(end)) => {
                    v6.push(Row { start: u128::from(start), end: u128::from(end), asn, line: number });
                }
                // parse_line refuses mixed families.
                _ => return Err(format!("line {number}: range_start and range_end are of different families")),
            }
        }
        Ok(Ranges {
            v4: table(v4, |a| IpAddr::from(Ipv4Addr::from(a)))?,
            v6: table(v6, |a| IpAddr::from(Ipv6Addr::from(a)))?,
        })
    }

    /// The AS of the (routed) range holding `ip`.
    pub(super) fn lookup(&self, ip: IpAddr) -> Option<u32> {
        match ip {
            IpAddr::V4(v4) => self.v4.lookup(u32::from(v4)),
            IpAddr::V6(v6) => self.v6.lookup(u128::from(v6)),
        }
    }

    /// How many (routed) IPv4 and IPv6 ranges were kept.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.v4.len(), self.v6.len())
    }
}

/// Sorts the rows, refuses overlaps, drops AS 0 and packs what is left.
fn table<A: Address>(mut rows: Vec<Row<A>>, show: impl Fn(A) -> IpAddr) -> Result<Table<A>, String> {
    rows.sort_unstable_by_key(|row| (row.start, row.line));
    if let Some(pair) = rows.windows(2).find(|pair| pair[1].start <= pair[0].end) {
        // Reported at the later line (the one most likely added by mistake), whichever starts first.
        let (a, b) = if pair[0].line < pair[1].line { (pair[0], pair[1]) } else { (pair[1], pair[0]) };
        return Err(format!(
            "line {}: range {}-{} overlaps line {}'s range {}-{}",
            b.line,
            show(b.start),
            show(b.end),
            a.line,
            show(a.start),
            show(a.end)
        ));
    }
    rows.retain(|row| row.asn != 0);
    Table::new(rows.iter().map(|row| row.start).collect(), rows.iter().map(|row| (row.end, row.asn)).collect())
}

/// `range_start`, `range_end` and `AS_number` of one non-blank, non-comment line.
fn parse_line(line: &str) -> Result<(IpAddr, IpAddr, u32), String> {
    let mut fields = line.split('\t');
    let (Some(start), Some(end), Some(asn)) = (fields.next(), fields.next(), fields.next()) else {
        return Err(format!(
            "expected range_start<TAB>range_end<TAB>AS_number<TAB>country_code<TAB>AS_description, \
             found {} tab-separated field(s) in {:?}",
            line.split('\t').count(),
            excerpt(line)
        ));
    };
    let address = |name: &str, text: &str| {
        text.trim().parse::<IpAddr>().map_err(|_| format!("{name} {:?} is not an IP address", excerpt(text)))
    };
    let (start, end) = (address("range_start", start)?, address("range_end", end)?);
    if start.is_ipv4() != end.is_ipv4() {
        return Err(format!("range_start {start} and range_end {end} are not of the same IP version"));
    }
    if start > end {
        return Err(format!("range_start {start} is after range_end {end}"));
    }
    let digits = asn.trim();
    let digits = digits.strip_prefix("AS").or_else(|| digits.strip_prefix("as")).unwrap_or(digits);
    let asn = digits
        .parse::<u32>()
        .map_err(|_| format!("AS_number {:?} is not a number in 0..={}", excerpt(asn), u32::MAX))?;
    Ok((start, end, asn))
}

/// At most 80 characters of `text`, for an error message (a line of a broken file can be huge).
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    #[test]
    fn an_overlap_is_reported_at_the_later_line_even_if_it_sorts_first() {
        let text = "1.0.0.0\t1.0.0.255\t1\n0.0.0.0\t1.0.0.0\t2\n";
        let error = Ranges::parse(text).unwrap_err();
        assert_eq!(error, "line 2: range 0.0.0.0-1.0.0.0 overlaps line 1's range 1.0.0.0-1.0.0.255");
    }

    #[test]
    fn a_range_reaches_into_buckets_where_nothing_starts() {
        let ranges = Ranges::parse("10.0.0.0\t10.5.0.0\t7\n10.5.0.2\t10.5.0.2\t8\n2000::\t2fff::\t9\n").unwrap();
        let v4 = |text: &str| ranges.lookup(text.parse().unwrap());
        assert_eq!(v4("9.255.255.255"), None);
        assert_eq!(v4("10.3.7.7"), Some(7));
        assert_eq!(v4("10.5.0.0"), Some(7));
        assert_eq!(v4("10.5.0.1"), None);
        assert_eq!(v4("10.5.0.2"), Some(8));
        assert_eq!(v4("10.5.0.3"), None);
        assert_eq!(v4("2abc::1"), Some(9));
        assert_eq!(v4("2fff::"), Some(9));
        assert_eq!(v4("2fff::1"), None);
    }

    #[test]
    fn a_huge_bad_line_is_quoted_in_part() {
        let error = Ranges::parse(&"x".repeat(100_000)).unwrap_err();
        assert!(
            error.starts_with("line 1: expected range_start") && error.ends_with(&format!("{}…\"", "x".repeat(80)))
        );
    }

    #[test]
    fn equal_starts_overlap() {
        let text = "::\t::ff\t0\n::\t::\t5\n";
        assert_eq!(Ranges::parse(text).unwrap_err(), "line 2: range ::-:: overlaps line 1's range ::-::ff");
    }
}
