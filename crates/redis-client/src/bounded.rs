//! What one server may send, bounded before it is parsed. A reader keeps a reply in memory until
//! it is whole, however long it says it is (`$9999999999`) or however long it goes on
//! (`*2147483647` and values, forever): a broken server, a compromised one, or anyone on the path
//! of a plain link could make tollgate's memory grow at the link's speed until the process is
//! killed. Every connection (`wire.rs`) follows the RESP framing of what it reads with
//! [`Framing`] (lengths, counts, nesting: no value is built), which also says where each reply
//! ends (so that a reply is parsed once, whole), and ends the connection, with an error naming
//! the bound, as soon as one reply would take more than [`MAX_REPLY_BYTES`] or
//! [`MAX_REPLY_VALUES`]. The calls waiting on it fail like on any lost connection, and the next
//! one makes another.
//!
//! The largest reply tollgate asks for is `CLUSTER SLOTS`: 16,384 one-slot ranges with a primary
//! and 16 replicas each are about 11 MB and 1.2 million values, within both bounds.

/// The most bytes one reply may take.
pub(crate) const MAX_REPLY_BYTES: u64 = 16 << 20;

/// The most values one reply may hold (each array, and each value in it, counts one): a value
/// takes 3 bytes on the wire and some 30 once parsed.
pub(crate) const MAX_REPLY_VALUES: u64 = 1 << 21;

/// The deepest nesting the driver parses (100 levels), with a margin.
const MAX_DEPTH: usize = 128;

/// The longest length or count line (`$5`, `*3`) read.
const MAX_HEADER: usize = 32;

/// Where the reading of a reply is.
#[derive(Debug)]
enum State {
    /// At the type byte of a value.
    Type,
    /// In a length or count line (`$`, `*`, …), of the type `kind`: its text so far.
    Header { kind: u8, text: Vec<u8>, cr: bool },
    /// In a value of one line (`+OK`, `:1`, `-ERR …`) until its `\r\n`; `cr`: the last byte was `\r`.
    Line { cr: bool },
    /// In a string's bytes: how many are left, its `\r\n` included.
    Payload(u64),
}

/// The framing of the replies read so far (see the module docs).
#[derive(Debug)]
pub(crate) struct Framing {
    state: State,
    /// The values still due in each array (or map, set, …) open, the innermost last.
    open: Vec<u64>,
    /// Bytes and values of the reply under way.
    bytes: u64,
    values: u64,
}

impl Default for Framing {
    fn default() -> Self {
        Framing { state: State::Type, open: Vec::new(), bytes: 0, values: 0 }
    }
}

impl Framing {
    /// Follows `input`, the next bytes read; an error says which bound a reply passed, or what is
    /// not RESP (which the parser would refuse too).
    #[cfg(test)]
    pub(crate) fn read(&mut self, input: &[u8]) -> Result<(), String> {
        self.split(input, |_| {})
    }

    /// Follows `input`, the next bytes read, calling `ended` with the offset in `input` just past
    /// each reply that ends in it; an error says which bound a reply passed, or what is not RESP.
    pub(crate) fn split(&mut self, input: &[u8], mut ended: impl FnMut(usize)) -> Result<(), String> {
        let mut rest_of = input;
        while let Some((&byte, rest)) = rest_of.split_first() {
            if let State::Payload(left) = &mut self.state {
                // A string's bytes are skipped whole, not looked at one by one.
                let taken = (*left).min(rest_of.len() as u64);
                *left -= taken;
                let done = *left == 0;
                rest_of = &rest_of[usize::try_from(taken).unwrap_or(rest_of.len())..];
                if done {
                    self.state = State::Type;
                    if self.value_done() {
                        ended(input.len() - rest_of.len());
                    }
                }
                continue;
            }
            self.bytes += 1;
            if self.bytes > MAX_REPLY_BYTES {
                return Err(format!("a reply of more than {MAX_REPLY_BYTES} bytes"));
            }
            rest_of = rest;
            let reply_done = match &mut self.state {
                State::Type => {
                    self.start(byte)?;
                    false
                }
                State::Line { cr } => match (byte, *cr) {
                    (b'\n', true) => {
                        self.state = State::Type;
                        self.value_done()
                    }
                    _ => {
                        *cr = byte == b'\r';
                        false
                    }
                },
                State::Header { kind, text, cr } => match (byte, *cr) {
                    (b'\n', true) => {
                        text.pop(); // its `\r`
                        let (kind, text) = (*kind, std::mem::take(text));
                        self.header(kind, &text)?
                    }
                    _ if text.len() >= MAX_HEADER => {
                        return Err(format!("a length line of more than {MAX_HEADER} bytes"));
                    }
                    _ => {
                        text.push(byte);
                        *cr = byte == b'\r';
                        false
                    }
                },
                State::Payload(_) => unreachable!("handled above"),
            };
            if reply_done {
                ended(input.len() - rest_of.len());
            }
        }
        Ok(())
    }

    /// A value of type `byte` starts.
    fn start(&mut self, byte: u8) -> Result<(), String> {
        self.values += 1;
        if self.values > MAX_REPLY_VALUES {
            return Err(format!("a reply of more than {MAX_REPLY_VALUES} values"));
        }
        self.state = match byte {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => State::Line { cr: false },
            b'$' | b'!' | b'=' | b'*' | b'~' | b'%' | b'|' | b'>' => {
                State::Header { kind: byte, text: Vec::new(), cr: false }
            }
            other => return Err(format!("a value of the unknown type {:?}", char::from(other))),
        };
        Ok(())
    }

    /// The length or count line `text` of a value of type `kind` has been read; whether that ended
    /// the reply.
    fn header(&mut self, kind: u8, text: &[u8]) -> Result<bool, String> {
        // As the driver reads it.
        let number = std::str::from_utf8(text).ok().and_then(|t| t.trim().parse::<i64>().ok());
        let Some(number) = number else { return Err("a length that is not a number".into()) };
        self.state = State::Type;
        let count = match (kind, u64::try_from(number)) {
            // A string: its bytes and `\r\n` follow (counted now, skipped as they come).
            (b'$' | b'!' | b'=', Ok(length)) => {
                let bytes = self.bytes.saturating_add(length).saturating_add(2);
                if bytes > MAX_REPLY_BYTES {
                    return Err(format!("a string of {length} bytes (at most {MAX_REPLY_BYTES} in one reply)"));
                }
                self.bytes = bytes;
                self.state = State::Payload(length + 2);
                return Ok(false);
            }
            // Nil, or a push of nothing.
            (b'$' | b'*' | b'~' | b'>', Err(_)) | (b'>', Ok(0)) => 0,
            (b'*' | b'~' | b'>', Ok(count)) => count,
            // A map's keys and values; an attribute's, then the value it is about.
            (b'%', Ok(pairs)) => pairs.saturating_mul(2),
            (b'|', Ok(pairs)) => pairs.saturating_mul(2).saturating_add(1),
            _ => return Err(format!("a length of {number} for a value of type {:?}", char::from(kind))),
        };
        if count > MAX_REPLY_VALUES - self.values {
            return Err(format!("{count} values in one reply (at most {MAX_REPLY_VALUES})"));
        }
        if count == 0 {
            return Ok(self.value_done());
        } else if self.open.len() >= MAX_DEPTH {
            return Err(format!("values nested more than {MAX_DEPTH} deep"));
        }
        self.open.push(count);
        Ok(false)
    }

    /// A value ended: so does each array it completes, and the reply once none is open (then
    /// `true`).
    fn value_done(&mut self) -> bool {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.open.pop();
        }
        self.bytes = 0;
        self.values = 0;
        true
    }
}

/// The error a connection ends with once a reply passed a bound (a connection aborted: the calls
/// waiting on it fail as on any lost connection, and the next call makes another).
pub(crate) fn refusal(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("{what} from the server: refused, and its connection ended"),
    )
}

#[cfg(test)]
impl Framing {
    /// Whether no reply is under way.
    fn idle(&self) -> bool {
        self.open.is_empty() && matches!(self.state, State::Type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `input` ends `replies` replies, read byte by byte, and is followed whole however it is cut
    /// into two reads.
    fn follows(input: &[u8], replies: usize) {
        let mut framing = Framing::default();
        let mut ended = 0;
        for byte in input {
            framing.read(std::slice::from_ref(byte)).unwrap();
            ended += usize::from(framing.idle());
        }
        assert_eq!(ended, replies, "{:?}", String::from_utf8_lossy(input));
        for cut in 0..=input.len() {
            let mut framing = Framing::default();
            framing.read(&input[..cut]).unwrap();
            framing.read(&input[cut..]).unwrap();
            assert!(framing.idle(), "{:?} cut at {cut}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn follows_every_kind_of_reply() {
        follows(b"+OK\r\n", 1);
        follows(b"-ERR no\r\n:5\r\n", 2);
        follows(b"$5\r\nhello\r\n$0\r\n\r\n$-1\r\n", 3);
        follows(b"$4\r\n\r\n\r\n\r\n", 1);
        follows(b"*2\r\n*1\r\n:1\r\n$3\r\nabc\r\n", 1);
        follows(b"*0\r\n*-1\r\n", 2);
        follows(b"%1\r\n+k\r\n:1\r\n~2\r\n_\r\n#t\r\n", 2);
        follows(b"|1\r\n+a\r\n+b\r\n:1\r\n>0\r\n>1\r\n+m\r\n", 3);
        follows(b",1.5\r\n(123\r\n!3\r\nerr\r\n=7\r\ntxt:abc\r\n", 4);
        follows(b"+a\rb\r\r\n", 1);
        follows(b"$ 3 \r\nabc\r\n", 1);
    }

    #[test]
    fn refuses_what_passes_a_bound_at_once() {
        for (input, wanted) in [
            (&b"$9999999999\r\n"[..], "a string of 9999999999 bytes"),
            (b"*2147483647\r\n", "2147483647 values in one reply"),
            (b"%9223372036854775807\r\n", "values in one reply"),
            (b"!-5\r\n", "a length of -5"),
            (b"%-1\r\n", "a length of -1"),
            (b"$abc\r\n", "not a number"),
            (b"$99999999999999999999999999999999999\r\n", "a length line of more than 32 bytes"),
            (b"?\r\n", "unknown type '?'"),
        ] {
            let error = Framing::default().read(input).unwrap_err();
            assert!(error.contains(wanted), "{:?}: {error}", String::from_utf8_lossy(input));
        }
        // Two strings of 9 MB in one reply: the second passes the bound.
        let mut framing = Framing::default();
        framing.read(b"*2\r\n$9000000\r\n").unwrap();
        framing.read(&vec![b'x'; 9_000_002]).unwrap();
        let error = framing.read(b"$9000000\r\n").unwrap_err();
        assert!(error.contains("a string of 9000000 bytes"), "{error}");
        let error = Framing::default().read(&b"*1\r\n".repeat(MAX_DEPTH + 1)).unwrap_err();
        assert!(error.contains("nested more than"), "{error}");
    }

    #[test]
    fn refuses_a_reply_that_never_ends_once_it_passes_a_bound() {
        let mut framing = Framing::default();
        framing.read(b"+").unwrap();
        let chunk = vec![b'x'; 1 << 16];
        let reads = (1..).find(|_| framing.read(&chunk).is_err()).unwrap();
        assert_eq!(reads, MAX_REPLY_BYTES >> 16, "refused with its 16 MiB");
        // Values, each within what its array announced.
        let mut framing = Framing::default();
        let announced = MAX_REPLY_VALUES - 2;
        framing.read(format!("*3\r\n*{announced}\r\n").as_bytes()).unwrap();
        framing.read(&b":1\r\n".repeat(usize::try_from(announced).unwrap())).unwrap();
        let error = framing.read(b":1\r\n").unwrap_err();
        assert!(error.contains(&format!("a reply of more than {MAX_REPLY_VALUES} values")), "{error}");
    }

    #[test]
    fn the_bounds_are_per_reply() {
        let mut framing = Framing::default();
        let half = MAX_REPLY_BYTES / 2;
        let reply = format!("${half}\r\n{}\r\n", "x".repeat(usize::try_from(half).unwrap()));
        for _ in 0..4 {
            framing.read(reply.as_bytes()).unwrap();
        }
        framing.read(&b":1\r\n".repeat(usize::try_from(MAX_REPLY_VALUES).unwrap() + 1)).unwrap();
        assert!(framing.idle());
    }
}
