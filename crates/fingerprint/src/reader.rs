//! A bounds-checked cursor over TLS wire bytes: every read that would run past the end is a
//! [`HelloError::Truncated`] naming the field, never a panic.

use crate::HelloError;

/// Reads big-endian integers and length-prefixed vectors (RFC 8446 §3) from a byte slice.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) const fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub(crate) const fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The next `len` bytes.
    pub(crate) fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], HelloError> {
        let (taken, rest) = self.rest.split_at_checked(len).ok_or(HelloError::Truncated { field })?;
        self.rest = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], HelloError> {
        let (taken, rest) = self.rest.split_first_chunk::<N>().ok_or(HelloError::Truncated { field })?;
        self.rest = rest;
        Ok(*taken)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, HelloError> {
        self.array::<1>(field).map(|[byte]| byte)
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, HelloError> {
        self.array(field).map(u16::from_be_bytes)
    }

    /// A vector with a one-byte length prefix (`opaque field<0..2^8-1>`), as a reader of its own.
    pub(crate) fn vec_u8(&mut self, field: &'static str) -> Result<Reader<'a>, HelloError> {
        let len = self.u8(field)?;
        self.take(usize::from(len), field).map(Reader::new)
    }

    /// A vector with a two-byte length prefix (`opaque field<0..2^16-1>`), as a reader of its own.
    pub(crate) fn vec_u16(&mut self, field: &'static str) -> Result<Reader<'a>, HelloError> {
        let len = self.u16(field)?;
        self.take(usize::from(len), field).map(Reader::new)
    }

    /// All the remaining bytes.
    pub(crate) fn rest(self) -> &'a [u8] {
        self.rest
    }

    /// The remaining bytes as a list of 16-bit values (cipher suites, groups, …).
    pub(crate) fn u16_list(self, field: &'static str) -> Result<Vec<u16>, HelloError> {
        let (pairs, odd) = self.rest.as_chunks::<2>();
        if !odd.is_empty() {
            return Err(HelloError::InvalidLength { field, len: self.rest.len() });
        }
        Ok(pairs.iter().map(|&pair| u16::from_be_bytes(pair)).collect())
    }

    /// Checks that the structure ended exactly here.
    pub(crate) fn finish(self, field: &'static str) -> Result<(), HelloError> {
        if self.rest.is_empty() { Ok(()) } else { Err(HelloError::TrailingBytes { field }) }
    }
}

#[cfg(test)]
mod tests {
    use super::Reader;
    use crate::HelloError;

    #[test]
    fn reads_integers_and_vectors_and_names_the_truncated_field() {
        let mut r = Reader::new(&[0x03, 0x03, 0x02, 0xaa, 0xbb, 0x00, 0x01]);
        assert_eq!(r.u16("version"), Ok(0x0303));
        assert_eq!(r.vec_u8("list").map(Reader::rest), Ok(&[0xaa, 0xbb][..]));
        assert_eq!(r.vec_u16("data").err(), Some(HelloError::Truncated { field: "data" }));
    }

    #[test]
    fn odd_u16_lists_and_trailing_bytes_are_errors() {
        assert_eq!(Reader::new(&[0, 1, 0, 2]).u16_list("groups"), Ok(vec![1, 2]));
        assert_eq!(
            Reader::new(&[0, 1, 0]).u16_list("groups"),
            Err(HelloError::InvalidLength { field: "groups", len: 3 })
        );
        assert_eq!(Reader::new(&[0]).finish("x"), Err(HelloError::TrailingBytes { field: "x" }));
        assert_eq!(Reader::new(&[]).finish("x"), Ok(()));
    }
}
