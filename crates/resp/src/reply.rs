//! RESP2 reply encoding into the connection's output buffer.

use bytes::{BufMut, BytesMut};

/// `+text`
pub fn simple(out: &mut BytesMut, text: &str) {
    out.put_u8(b'+');
    out.put_slice(text.as_bytes());
    out.put_slice(b"\r\n");
}

/// `-message`: line breaks in the message are replaced, so one error stays one line.
pub fn error(out: &mut BytesMut, message: &str) {
    out.put_u8(b'-');
    for byte in message.bytes() {
        out.put_u8(if byte == b'\r' || byte == b'\n' { b' ' } else { byte });
    }
    out.put_slice(b"\r\n");
}

/// `:n`
pub fn integer(out: &mut BytesMut, n: i64) {
    out.put_u8(b':');
    put_decimal(out, n);
    out.put_slice(b"\r\n");
}

/// `*n`, followed by n replies.
pub fn array(out: &mut BytesMut, n: usize) {
    out.put_u8(b'*');
    put_decimal(out, i64::try_from(n).unwrap_or(i64::MAX));
    out.put_slice(b"\r\n");
}

/// `$len` and the bytes.
pub fn bulk(out: &mut BytesMut, data: &[u8]) {
    out.put_u8(b'$');
    put_decimal(out, i64::try_from(data.len()).unwrap_or(i64::MAX));
    out.put_slice(b"\r\n");
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// The null bulk string `$-1`: RESP2's "no value" (RESP3's `_` is not spoken: `HELLO 3` is
/// refused), what Redis answers for a missing key or an unset client name.
pub fn null(out: &mut BytesMut) {
    out.put_slice(b"$-1\r\n");
}

/// An array of integers.
pub fn integers(out: &mut BytesMut, values: &[i64]) {
    array(out, values.len());
    for &v in values {
        integer(out, v);
    }
}

fn put_decimal(out: &mut BytesMut, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        // The remainder is below 10.
        digits[at] = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.put_u8(b'-');
    }
    out.put_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes() {
        let mut out = BytesMut::new();
        integers(&mut out, &[0, -1, i64::MIN, 42]);
        bulk(&mut out, b"hi");
        error(&mut out, "ERR a\r\nb");
        simple(&mut out, "OK");
        assert_eq!(
            &out[..],
            &b"*4\r\n:0\r\n:-1\r\n:-9223372036854775808\r\n:42\r\n$2\r\nhi\r\n-ERR a  b\r\n+OK\r\n"[..]
        );
    }

    /// A null is RESP2's null bulk string, which a client reads as no value (not as an empty
    /// string, which is `$0`).
    #[test]
    fn encodes_null() {
        let mut out = BytesMut::new();
        null(&mut out);
        bulk(&mut out, b"");
        assert_eq!(&out[..], &b"$-1\r\n$0\r\n\r\n"[..]);
        let (value, used) = crate::Value::parse(&out).unwrap().unwrap();
        assert_eq!((value, used), (crate::Value::Bulk(None), 5));
    }
}
