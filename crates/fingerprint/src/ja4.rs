//! JA4 for TLS over TCP (FoxIO, `technical_details/JA4.md` of <https://github.com/FoxIO-LLC/ja4>):
//! `a_b_c` where
//!
//! - `a` = `t`, the version (`13`, `12`, …), `d` with an SNI extension else `i`, the counts of
//!   cipher suites and of extensions (two digits, at most 99), and two characters of the first
//!   ALPN protocol;
//! - `b` = the cipher suites as 4-digit hex, sorted, joined by `,`;
//! - `c` = the extensions likewise, without SNI (0000) and ALPN (0010), then `_` and the signature
//!   algorithms in wire order (no `_` when there are none).
//!
//! JA4 hashes `b` and `c` (first 12 hex digits of their SHA-256, `000000000000` for an empty list);
//! `ja4_r` shows them as they are. GREASE values are ignored everywhere, as the spec says
//! ("ignore GREASE values anywhere it sees them"), signature algorithms included.

use sha2::{Digest as _, Sha256};

use crate::hello::ext;
use crate::{ClientHello, is_grease, to_hex};

/// What JA4 shows for a hash of an empty list: visibly nothing, rather than SHA-256 of "".
const EMPTY_HASH: &str = "000000000000";

impl ClientHello {
    /// The JA4 fingerprint, e.g. `t13d1516h2_8daaf6152771_e5627efa2ab1`.
    pub fn ja4(&self) -> String {
        let parts = self.ja4_parts();
        let ciphers = if parts.ciphers.is_empty() { EMPTY_HASH.to_owned() } else { hash12(&hex_list(&parts.ciphers)) };
        // Signature algorithms come from an extension: no extensions, nothing to hash.
        let extensions = if parts.extensions.is_empty() { EMPTY_HASH.to_owned() } else { hash12(&parts.c()) };
        format!("{}_{ciphers}_{extensions}", parts.a)
    }

    /// The raw JA4 (`ja4_r`): [`ClientHello::ja4`] with its lists unhashed, e.g.
    /// `t13d1516h2_002f,0035,…,cca9_0005,000a,…,ff01_0403,0804,…,0601`.
    pub fn ja4_raw(&self) -> String {
        let parts = self.ja4_parts();
        format!("{}_{}_{}", parts.a, hex_list(&parts.ciphers), parts.c())
    }

    fn ja4_parts(&self) -> Parts {
        let mut ciphers = non_grease(&self.cipher_suites);
        let extensions = non_grease(&self.extensions);
        let a = format!(
            "t{version}{sni}{ciphers:02}{extensions:02}{alpn}",
            version = version_code(self.ja4_version()),
            sni = if extensions.contains(&ext::SERVER_NAME) { 'd' } else { 'i' },
            ciphers = ciphers.len().min(99),
            extensions = extensions.len().min(99),
            alpn = alpn_code(self.alpn.first().map(Vec::as_slice)),
        );
        ciphers.sort_unstable();
        let mut extensions: Vec<u16> =
            extensions.into_iter().filter(|&e| e != ext::SERVER_NAME && e != ext::ALPN).collect();
        extensions.sort_unstable();
        Parts { a, ciphers, extensions, signature_algorithms: non_grease(&self.signature_algorithms) }
    }

    /// The highest non-GREASE `supported_versions` value, else `legacy_version` (when the
    /// extension is absent, or holds nothing but GREASE).
    fn ja4_version(&self) -> u16 {
        non_grease(&self.supported_versions).into_iter().max().unwrap_or(self.legacy_version)
    }
}

/// The pieces of JA4, GREASE removed.
struct Parts {
    /// The readable first part, `t13d1516h2`.
    a: String,
    /// Sorted.
    ciphers: Vec<u16>,
    /// Sorted, without SNI and ALPN.
    extensions: Vec<u16>,
    /// In wire order.
    signature_algorithms: Vec<u16>,
}

impl Parts {
    /// The raw third part: extensions, then `_` and the signature algorithms if there are any.
    fn c(&self) -> String {
        let mut c = hex_list(&self.extensions);
        if !self.signature_algorithms.is_empty() {
            c.push('_');
            c.push_str(&hex_list(&self.signature_algorithms));
        }
        c
    }
}

fn non_grease(values: &[u16]) -> Vec<u16> {
    values.iter().copied().filter(|&v| !is_grease(v)).collect()
}

/// The two characters JA4 gives a protocol version.
const fn version_code(version: u16) -> &'static str {
    match version {
        0x0304 => "13",
        0x0303 => "12",
        0x0302 => "11",
        0x0301 => "10",
        0x0300 => "s3",
        0x0002 => "s2",
        0xfeff => "d1",
        0xfefd => "d2",
        0xfefc => "d3",
        _ => "00",
    }
}

/// The first and last characters of the first ALPN protocol: `00` without one (or when it is
/// empty), the characters themselves when both are ASCII alphanumeric, else the first and last
/// digits of the protocol's hex (the current spec; older JA4 versions printed `99`).
fn alpn_code(first: Option<&[u8]>) -> String {
    let Some((&head, &tail)) = first.and_then(|p| p.first().zip(p.last())) else { return "00".to_owned() };
    if head.is_ascii_alphanumeric() && tail.is_ascii_alphanumeric() {
        [char::from(head), char::from(tail)].into_iter().collect()
    } else {
        // The first and last of the four hex digits of `head` and `tail`.
        to_hex(&[head, tail]).chars().step_by(3).collect()
    }
}

/// Values as lowercase 4-digit hex joined by `,`.
fn hex_list(values: &[u16]) -> String {
    values.iter().map(|v| to_hex(&v.to_be_bytes())).collect::<Vec<_>>().join(",")
}

/// The first 12 lowercase hex digits of the SHA-256 of `text`.
fn hash12(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    to_hex(digest.get(..6).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::{alpn_code, hash12};

    /// The worked example of the JA4 technical details (FoxIO-LLC/ja4, technical_details/JA4.md).
    #[test]
    fn the_specs_raw_lists_hash_to_its_published_values() {
        let ciphers = "002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9";
        assert_eq!(hash12(ciphers), "8daaf6152771");
        let extensions = "0005,000a,000b,000d,0012,0015,0017,001b,0023,002b,002d,0033,4469,ff01";
        let with_sigs = format!("{extensions}_0403,0804,0401,0503,0805,0501,0806,0601");
        assert_eq!(hash12(&with_sigs), "e5627efa2ab1");
        assert_eq!(hash12(extensions), "6d807ffa2a79");
        // JA4_o (original order, SNI and ALPN kept) of the same hello.
        let ro_ciphers = "1301,1302,1303,c02b,c02f,c02c,c030,cca9,cca8,c013,c014,009c,009d,002f,0035";
        let ro_extensions = "001b,0000,0033,0010,4469,0017,002d,000d,0005,0023,0012,002b,ff01,000b,000a,0015";
        assert_eq!(hash12(ro_ciphers), "acb858a92679");
        assert_eq!(hash12(&format!("{ro_extensions}_0403,0804,0401,0503,0805,0501,0806,0601")), "18f69afefd3d");
    }

    /// Every example of the spec's "ALPN Extension Value" section, and its plain cases.
    #[test]
    fn alpn_characters_follow_the_spec() {
        let cases: [(&[u8], &str); 12] = [
            (b"h2", "h2"),
            (b"http/1.1", "h1"),
            (b"x", "xx"),
            (&[0xab], "ab"),
            (&[0x20], "20"),
            (&[0xab, 0xcd], "ad"),
            (&[0x20, 0x61], "21"),
            (&[0x30, 0xab], "3b"),
            (&[0x61, 0x20], "60"),
            (&[0x30, 0x31, 0xab, 0xcd], "3d"),
            (&[0x30, 0xab, 0xcd, 0x31], "01"),
            (b"", "00"),
        ];
        for (protocol, code) in cases {
            assert_eq!(alpn_code(Some(protocol)), code, "{protocol:?}");
        }
        assert_eq!(alpn_code(None), "00");
    }
}
