//! A MaxMind DB (GeoLite2-ASN and the like), read from memory by the `maxminddb` crate.
//!
//! Only `autonomous_system_number` is decoded, into a struct that borrows nothing: a lookup is a
//! walk down the search tree and a scan of one small map, no allocation. A database whose records
//! do not carry that field (a City or Country database, an Enterprise one that nests it under
//! `traits`) is refused at load, since every lookup would silently be `None`.

use std::net::IpAddr;

use maxminddb::{Reader, WithinOptions};
use serde::Deserialize;

/// How many records the load-time check reads: enough to find the field in any real ASN
/// database (every record has it), few enough that refusing a City database stays instant.
const SAMPLE: usize = 32;

/// The fields of a record we read; the others are skipped unread.
#[derive(Deserialize)]
struct Record {
    autonomous_system_number: Option<u32>,
}

/// A loaded database.
#[derive(Debug)]
pub(super) struct Mmdb {
    reader: Reader<Vec<u8>>,
}

impl Mmdb {
    /// Opens the image and checks that it is an ASN database.
    pub(super) fn new(bytes: Vec<u8>) -> Result<Mmdb, String> {
        let reader = Reader::from_source(bytes).map_err(|e| format!("not a readable MaxMind database: {e}"))?;
        let db = Mmdb { reader };
        db.check_has_asns()?;
        Ok(db)
    }

    /// Reads the first [`SAMPLE`] records: one with `autonomous_system_number` makes an ASN
    /// database; a database with no records at all is accepted when its type says ASN (an empty
    /// but genuine database: every lookup is `None`, as it should be).
    fn check_has_asns(&self) -> Result<(), String> {
        let kind = &self.reader.metadata().database_type;
        let networks =
            self.reader.networks(WithinOptions::default()).map_err(|e| format!("unreadable search tree: {e}"))?;
        let mut sampled = 0;
        for network in networks.take(SAMPLE) {
            let network = network.map_err(|e| format!("unreadable search tree: {e}"))?;
            let record = match network.decode::<Record>() {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(e) => return Err(format!("not an ASN database: a record does not decode as one: {e}")),
            };
            if record.autonomous_system_number.is_some() {
                return Ok(());
            }
            sampled += 1;
        }
        if sampled == 0 && kind.contains("ASN") {
            return Ok(());
        }
        Err(format!(
            "not an ASN database: its type is {kind:?} and {} carries autonomous_system_number",
            if sampled == 0 { "no record".to_owned() } else { format!("none of the first {sampled} records") }
        ))
    }

    /// The AS number of `ip`'s record; `None` for no record, no field, or any decoding error (a
    /// corrupt database must not take the request path down: the caller treats it as unknown).
    pub(super) fn lookup(&self, ip: IpAddr) -> Option<u32> {
        let found = self.reader.lookup(ip).ok()?;
        found.decode::<Record>().ok()??.autonomous_system_number
    }

    /// `"GeoLite2-ASN (mmdb, 1,234 nodes, built 2026-11-01)"`.
    pub(super) fn describe(&self) -> String {
        let metadata = self.reader.metadata();
        format!(
            "{} (mmdb, {} nodes, built {})",
            metadata.database_type,
            super::thousands(u64::from(metadata.node_count)),
            super::utc_date(metadata.build_epoch)
        )
    }
}
