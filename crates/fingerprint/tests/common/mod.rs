//! Test helpers: a ClientHello writer (the wire format of RFC 8446 §4.1.2, written independently
//! of the parser under test), record framing, and hex test data.

#![allow(dead_code, reason = "each test file uses its own part of the helpers")]

/// A ClientHello to write: extensions as (type, raw contents), in the order given.
#[derive(Clone, Debug)]
pub(crate) struct HelloBuilder {
    pub(crate) legacy_version: u16,
    pub(crate) session_id: Vec<u8>,
    pub(crate) ciphers: Vec<u16>,
    /// `None`: no extensions block at all (as SSL 3.0 and early TLS clients may send).
    pub(crate) extensions: Option<Vec<(u16, Vec<u8>)>>,
}

impl HelloBuilder {
    pub(crate) fn new(legacy_version: u16) -> Self {
        Self { legacy_version, session_id: vec![0x5e; 32], ciphers: Vec::new(), extensions: Some(Vec::new()) }
    }

    pub(crate) fn ciphers(mut self, ciphers: &[u16]) -> Self {
        self.ciphers = ciphers.to_vec();
        self
    }

    pub(crate) fn no_extensions_block(mut self) -> Self {
        self.extensions = None;
        self
    }

    pub(crate) fn ext(mut self, ty: u16, data: &[u8]) -> Self {
        self.extensions.get_or_insert_with(Vec::new).push((ty, data.to_vec()));
        self
    }

    pub(crate) fn sni(self, host: &str) -> Self {
        let entry = [&[0u8][..], &u16_len(host.as_bytes()), host.as_bytes()].concat();
        self.ext(0x0000, &[u16_len(&entry).as_slice(), &entry].concat())
    }

    pub(crate) fn alpn(self, protocols: &[&[u8]]) -> Self {
        let list: Vec<u8> = protocols.iter().flat_map(|p| [&[u8_len(p)][..], p].concat()).collect();
        self.ext(0x0010, &[u16_len(&list).as_slice(), &list].concat())
    }

    pub(crate) fn groups(self, groups: &[u16]) -> Self {
        self.ext(0x000a, &u16_vec(groups))
    }

    pub(crate) fn point_formats(self, formats: &[u8]) -> Self {
        self.ext(0x000b, &[&[u8_len(formats)][..], formats].concat())
    }

    pub(crate) fn signature_algorithms(self, algorithms: &[u16]) -> Self {
        self.ext(0x000d, &u16_vec(algorithms))
    }

    pub(crate) fn versions(self, versions: &[u16]) -> Self {
        let list = be16(versions);
        self.ext(0x002b, &[&[u8_len(&list)][..], &list].concat())
    }

    /// The handshake message body (after the 4-byte header).
    pub(crate) fn body(&self) -> Vec<u8> {
        let mut b = self.legacy_version.to_be_bytes().to_vec();
        b.extend((0..32u8).map(|i| i.wrapping_mul(37)));
        b.push(u8_len(&self.session_id));
        b.extend(&self.session_id);
        b.extend(u16_vec(&self.ciphers));
        b.extend([1, 0]); // compression: null only
        if let Some(extensions) = &self.extensions {
            let block: Vec<u8> = extensions
                .iter()
                .flat_map(|(ty, data)| [&ty.to_be_bytes()[..], &u16_len(data), data].concat())
                .collect();
            b.extend(u16_len(&block));
            b.extend(block);
        }
        b
    }

    /// The whole handshake message: type 1, 24-bit length, body.
    pub(crate) fn message(&self) -> Vec<u8> {
        let body = self.body();
        let [_, a, b, c] = u32::try_from(body.len()).unwrap().to_be_bytes();
        [&[1, a, b, c][..], &body].concat()
    }

    /// The message in handshake records of at most `fragment` bytes each.
    pub(crate) fn records(&self, fragment: usize) -> Vec<u8> {
        let message = self.message();
        let sizes = std::iter::repeat_n(fragment, message.len().div_ceil(fragment));
        records(&message, sizes)
    }
}

/// `data` cut into handshake records (version 0x0301, as clients send their first record) of the
/// given sizes; the last record takes whatever remains.
pub(crate) fn records(data: &[u8], sizes: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut sizes = sizes.into_iter();
    while !rest.is_empty() {
        let size = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (fragment, after) = rest.split_at(size);
        out.extend([22, 3, 1]);
        out.extend(u16_len(fragment));
        out.extend(fragment);
        rest = after;
    }
    out
}

/// Bytes from hex, whitespace ignored (the data files of tests/data).
pub(crate) fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).expect("hex test data"))
        .collect()
}

fn be16(values: &[u16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

fn u16_vec(values: &[u16]) -> Vec<u8> {
    let list = be16(values);
    [u16_len(&list).as_slice(), &list].concat()
}

fn u8_len(data: &[u8]) -> u8 {
    u8::try_from(data.len()).expect("fits a one-byte length")
}

fn u16_len(data: &[u8]) -> [u8; 2] {
    u16::try_from(data.len()).expect("fits a two-byte length").to_be_bytes()
}
