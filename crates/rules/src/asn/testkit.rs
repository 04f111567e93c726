//! Test databases, built in memory: a minimal MaxMind DB writer (format 2.0, after the MaxMind DB
//! File Format Specification) and iptoasn TSV text, so that tests here and in other crates ship
//! the databases they read rather than download one.
//!
//! The writer makes an IPv6 tree (`ip_version` 6) with IPv4 networks under `::/96`, as MaxMind
//! does, so both families look up. Unlike MaxMind's databases it adds no `::ffff:0:0/96` alias:
//! an IPv4-mapped lookup succeeds only because [`AsnDb`](super::AsnDb) maps it to IPv4 itself,
//! which the tests therefore check. Where entries overlap, the later one wins.
//!
//! Test code: bad input (an unparsable CIDR, say) panics with a message.

use std::collections::HashMap;
use std::net::IpAddr;

/// A data-section value (the types a MaxMind ASN database uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// UTF-8 string (type 2).
    Str(String),
    /// Unsigned 16-bit integer (type 5).
    U16(u16),
    /// Unsigned 32-bit integer (type 6).
    U32(u32),
    /// Unsigned 64-bit integer (type 9).
    U64(u64),
    /// Map from string keys (type 7).
    Map(Vec<(String, Value)>),
    /// Array (type 11).
    Array(Vec<Value>),
}

impl Value {
    /// A map from `(key, value)` pairs.
    pub fn map<const N: usize>(pairs: [(&str, Value); N]) -> Value {
        Value::Map(pairs.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
    }

    /// A GeoLite2-ASN record: `{autonomous_system_number, autonomous_system_organization}`.
    pub fn asn(asn: u32, organization: &str) -> Value {
        Value::map([
            ("autonomous_system_number", Value::U32(asn)),
            ("autonomous_system_organization", Value::Str(organization.to_owned())),
        ])
    }
}

/// A GeoLite2-ASN-like database mapping each CIDR (`"198.51.100.0/24"`, `"2001:db8::/32"`; a bare
/// address is a /32 or /128) to its AS number and organisation.
///
/// # Panics
/// On a CIDR that does not parse or has host bits set.
pub fn mmdb(entries: &[(&str, u32, &str)]) -> Vec<u8> {
    let mut writer = Writer::new("GeoLite2-ASN");
    for &(cidr, asn, organization) in entries {
        writer.insert(cidr, Value::asn(asn, organization));
    }
    writer.build()
}

/// The database holding the same ranges as [`tsv`] of the same entries (each inclusive range
/// split into the CIDR blocks that cover exactly it).
///
/// # Panics
/// On an address that does not parse, or a range whose ends differ in family or are reversed.
pub fn mmdb_ranges(entries: &[(&str, &str, u32, &str, &str)]) -> Vec<u8> {
    let mut writer = Writer::new("GeoLite2-ASN");
    for &(start, end, asn, _country, description) in entries {
        writer.insert_range(parse_ip(start), parse_ip(end), &Value::asn(asn, description));
    }
    writer.build()
}

/// iptoasn TSV text: one `range_start\trange_end\tAS_number\tcountry_code\tAS_description` line
/// per entry.
pub fn tsv(entries: &[(&str, &str, u32, &str, &str)]) -> String {
    entries
        .iter()
        .map(|(start, end, asn, country, description)| format!("{start}\t{end}\t{asn}\t{country}\t{description}\n"))
        .collect()
}

/// A search-tree record: nothing, another node, or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Empty,
    Node(usize),
    Data(usize),
}

/// Builds a MaxMind DB of any records (a City-like one without ASNs, for instance).
#[derive(Debug, Clone)]
pub struct Writer {
    database_type: String,
    build_epoch: u64,
    /// Node 0 is the root; a node is its `[left, right]` records (bit 0, bit 1).
    nodes: Vec<[Slot; 2]>,
    values: Vec<Value>,
}

impl Writer {
    /// An empty IPv6 database of type `database_type`, built 2026-01-01 (fixed, so that the
    /// output is reproducible).
    pub fn new(database_type: &str) -> Writer {
        Writer {
            database_type: database_type.to_owned(),
            build_epoch: 1_767_225_600,
            nodes: vec![[Slot::Empty; 2]],
            values: Vec::new(),
        }
    }

    /// Sets the metadata's `build_epoch` (Unix seconds).
    #[must_use]
    pub fn built_at(mut self, epoch_seconds: u64) -> Writer {
        self.build_epoch = epoch_seconds;
        self
    }

    /// Maps the CIDR block `cidr` to `value` (over whatever was there).
    ///
    /// # Panics
    /// On a CIDR that does not parse or has host bits set.
    pub fn insert(&mut self, cidr: &str, value: Value) {
        let (address, prefix) = match cidr.split_once('/') {
            Some((address, prefix)) => {
                (parse_ip(address), prefix.parse::<u32>().unwrap_or_else(|_| panic!("testkit: bad prefix in {cidr:?}")))
            }
            None => {
                let address = parse_ip(cidr);
                (address, if address.is_ipv4() { 32 } else { 128 })
            }
        };
        let (key, prefix) = tree_key(address, prefix);
        assert!(prefix <= 128, "testkit: prefix too long in {cidr:?}");
        assert_eq!(key & !mask(prefix), 0, "testkit: {cidr:?} has host bits set");
        self.values.push(value);
        self.insert_key(key, prefix, self.values.len() - 1);
    }

    /// Maps every address from `start` to `end` inclusive to `value`.
    ///
    /// # Panics
    /// When `start` and `end` differ in family or `start > end`.
    pub fn insert_range(&mut self, start: IpAddr, end: IpAddr, value: &Value) {
        assert_eq!(start.is_ipv4(), end.is_ipv4(), "testkit: {start}-{end} mixes IPv4 and IPv6");
        assert!(start <= end, "testkit: {start}-{end} is reversed");
        let (start, end) = (tree_key(start, 0).0, tree_key(end, 0).0);
        self.values.push(value.clone());
        let value = self.values.len() - 1;
        // An IPv4 range lies within `::/96`, so its blocks are at most 2^32 addresses: /96 or longer.
        for (block, size_log) in blocks(start, end) {
            self.insert_key(block, 128 - size_log, value);
        }
    }

    fn insert_key(&mut self, key: u128, prefix: u32, value: usize) {
        let bit = |depth: u32| usize::from((key >> (127 - depth)) & 1 == 1);
        if prefix == 0 {
            self.nodes[0] = [Slot::Data(value); 2];
            return;
        }
        let mut node = 0;
        for depth in 0..prefix - 1 {
            node = match self.nodes[node][bit(depth)] {
                Slot::Node(next) => next,
                // A new node whose halves both keep what covered the whole block so far.
                leaf => {
                    self.nodes.push([leaf; 2]);
                    self.nodes[node][bit(depth)] = Slot::Node(self.nodes.len() - 1);
                    self.nodes.len() - 1
                }
            };
        }
        self.nodes[node][bit(prefix - 1)] = Slot::Data(value);
    }

    /// The database image: search tree, 16 zero bytes, data section, metadata marker, metadata.
    ///
    /// # Panics
    /// When the database needs more than 32-bit records (gigabytes: not a test database).
    pub fn build(&self) -> Vec<u8> {
        // Number the nodes still reachable (an overwritten block orphans its subtree) breadth-first.
        let mut numbers: Vec<Option<usize>> = vec![None; self.nodes.len()];
        let mut order = vec![0];
        numbers[0] = Some(0);
        let mut next = 0;
        while let Some(&node) = order.get(next) {
            next += 1;
            for slot in self.nodes[node] {
                if let Slot::Node(child) = slot {
                    numbers[child] = Some(order.len());
                    order.push(child);
                }
            }
        }
        let node_count = order.len();

        // The data section, each distinct value written once.
        let mut data = Vec::new();
        let mut offsets: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut value_offsets = vec![0; self.values.len()];
        for (index, value) in self.values.iter().enumerate() {
            let mut encoded = Vec::new();
            encode(&mut encoded, value);
            value_offsets[index] = *offsets.entry(encoded).or_insert_with_key(|encoded| {
                data.extend_from_slice(encoded);
                data.len() - encoded.len()
            });
        }

        let record = |slot: Slot| match slot {
            Slot::Empty => node_count,
            Slot::Node(node) => numbers[node].unwrap_or(node_count),
            Slot::Data(value) => node_count + 16 + value_offsets[value],
        };
        let largest = node_count + 16 + data.len();
        let record_size: u16 = if largest < 1 << 24 { 24 } else { 32 };
        let mut out = Vec::new();
        for &node in &order {
            for slot in self.nodes[node] {
                let bytes = u32::try_from(record(slot)).expect("testkit: database too large").to_be_bytes();
                out.extend_from_slice(if record_size == 24 { &bytes[1..] } else { &bytes });
            }
        }
        out.extend_from_slice(&[0; 16]);
        out.extend_from_slice(&data);
        out.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
        let metadata = Value::map([
            ("binary_format_major_version", Value::U16(2)),
            ("binary_format_minor_version", Value::U16(0)),
            ("build_epoch", Value::U64(self.build_epoch)),
            ("database_type", Value::Str(self.database_type.clone())),
            ("description", Value::map([("en", Value::Str(format!("tollgate test {}", self.database_type)))])),
            ("ip_version", Value::U16(6)),
            ("languages", Value::Array(vec![Value::Str("en".to_owned())])),
            ("node_count", Value::U32(u32::try_from(node_count).expect("testkit: too many nodes"))),
            ("record_size", Value::U16(record_size)),
        ]);
        encode(&mut out, &metadata);
        out
    }
}

fn parse_ip(text: &str) -> IpAddr {
    text.parse().unwrap_or_else(|_| panic!("testkit: {text:?} is not an IP address"))
}

/// An address (and prefix) in the IPv6 tree: IPv4 sits under `::/96`.
fn tree_key(address: IpAddr, prefix: u32) -> (u128, u32) {
    match address {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 96 + prefix),
        IpAddr::V6(v6) => (u128::from(v6), prefix),
    }
}

/// The network bits of a `/prefix`.
fn mask(prefix: u32) -> u128 {
    u128::MAX.checked_shl(128 - prefix).unwrap_or(0)
}

/// The aligned blocks `(first address, log2 of size)` covering exactly `start..=end`.
fn blocks(mut start: u128, end: u128) -> Vec<(u128, u32)> {
    let mut out = Vec::new();
    loop {
        // The largest block aligned at `start` that stays within `end`.
        let mut size_log = start.trailing_zeros().min(128);
        let last = |size_log: u32| start | !mask(128 - size_log);
        while last(size_log) > end {
            size_log -= 1;
        }
        out.push((start, size_log));
        match last(size_log).checked_add(1) {
            Some(next) if last(size_log) < end => start = next,
            _ => return out,
        }
    }
}

/// Appends a value's control byte(s) and payload (spec: "Data Field Format").
fn encode(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Str(text) => {
            control(out, 2, text.len());
            out.extend_from_slice(text.as_bytes());
        }
        Value::U16(n) => unsigned(out, 5, u64::from(*n)),
        Value::U32(n) => unsigned(out, 6, u64::from(*n)),
        Value::U64(n) => unsigned(out, 9, *n),
        Value::Map(pairs) => {
            control(out, 7, pairs.len());
            for (key, value) in pairs {
                encode(out, &Value::Str(key.clone()));
                encode(out, value);
            }
        }
        Value::Array(items) => {
            control(out, 11, items.len());
            for item in items {
                encode(out, item);
            }
        }
    }
}

/// An unsigned integer in as few big-endian bytes as hold it (zero in none).
fn unsigned(out: &mut Vec<u8>, kind: u8, n: u64) {
    let bytes = n.to_be_bytes();
    let skip = bytes.iter().take_while(|&&b| b == 0).count();
    control(out, kind, bytes.len() - skip);
    out.extend_from_slice(&bytes[skip..]);
}

/// The control byte: type in the top 3 bits (0 and a second byte `type - 7` for types over 7),
/// size in the low 5 (29, 30, 31: the size minus 29, 285, 65,821 follows in 1, 2, 3 bytes).
fn control(out: &mut Vec<u8>, kind: u8, size: usize) {
    let size = u32::try_from(size).expect("testkit: value too large");
    let (bits, extra): (u8, &[u8]) = match size {
        0..29 => (size.to_be_bytes()[3], &[]),
        29..285 => (29, &(size - 29).to_be_bytes()[3..]),
        285..65_821 => (30, &(size - 285).to_be_bytes()[2..]),
        _ => (31, &(size - 65_821).to_be_bytes()[1..]),
    };
    assert!(size <= 16_843_036, "testkit: value too large");
    if kind <= 7 {
        out.push((kind << 5) | bits);
    } else {
        out.extend_from_slice(&[bits, kind - 7]);
    }
    out.extend_from_slice(extra);
}

#[cfg(test)]
mod tests {
    use super::{blocks, mask};

    #[test]
    fn ranges_split_into_aligned_blocks() {
        assert_eq!(blocks(0, u128::MAX), vec![(0, 128)]);
        assert_eq!(blocks(5, 5), vec![(5, 0)]);
        assert_eq!(blocks(1, 6), vec![(1, 0), (2, 1), (4, 1), (6, 0)]);
        assert_eq!(blocks(u128::MAX - 1, u128::MAX), vec![(u128::MAX - 1, 1)]);
        assert_eq!(mask(0), 0);
        assert_eq!(mask(128), u128::MAX);
    }
}
