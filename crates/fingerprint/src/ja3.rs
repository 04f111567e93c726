//! JA3 (Salesforce, <https://github.com/salesforce/ja3>): the decimal values of
//! `SSLVersion,Cipher,SSLExtension,EllipticCurve,EllipticCurvePointFormat`, each list in wire order
//! joined by `-`, GREASE removed from the first three lists, and the MD5 of that string.

use std::fmt::Write as _;

use md5::{Digest as _, Md5};

use crate::{ClientHello, is_grease, to_hex};

impl ClientHello {
    /// The JA3 string, e.g. `771,4865-4866-4867,0-23-65281-10-11,29-23-24,0`.
    ///
    /// The version is `legacy_version` (not the record version, nor `supported_versions`); an
    /// empty list leaves its field empty (`769,47,,,`).
    pub fn ja3_string(&self) -> String {
        let mut ja3 = self.legacy_version.to_string();
        let non_grease = |values: &[u16]| values.iter().copied().filter(|&v| !is_grease(v)).collect::<Vec<_>>();
        push_list(&mut ja3, non_grease(&self.cipher_suites));
        push_list(&mut ja3, non_grease(&self.extensions));
        push_list(&mut ja3, non_grease(&self.supported_groups));
        push_list(&mut ja3, self.ec_point_formats.iter().copied());
        ja3
    }

    /// The JA3 fingerprint: MD5 of [`ClientHello::ja3_string`], 32 lowercase hex characters.
    pub fn ja3(&self) -> String {
        to_hex(&Md5::digest(self.ja3_string().as_bytes()))
    }
}

/// Appends `,` and the decimal `values` joined by `-`.
fn push_list<T: std::fmt::Display>(out: &mut String, values: impl IntoIterator<Item = T>) {
    out.push(',');
    for (i, value) in values.into_iter().enumerate() {
        if i > 0 {
            out.push('-');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use crate::ClientHello;

    #[test]
    fn grease_is_dropped_from_ciphers_extensions_and_curves_and_empty_lists_stay_empty() {
        let hello = ClientHello {
            legacy_version: 0x0303,
            cipher_suites: vec![0x0a0a, 0x1301, 0xfafa, 0x00ff],
            extensions: vec![0x2a2a, 0x0000, 0x000a, 0x3a3a],
            supported_groups: vec![0x4a4a, 0x001d, 0x0017],
            ..ClientHello::default()
        };
        assert_eq!(hello.ja3_string(), "771,4865-255,0-10,29-23,");
        assert_eq!(ClientHello::default().ja3_string(), "0,,,,");
    }
}
