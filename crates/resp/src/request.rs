//! RESP request framing, check-then-parse: a command is parsed only once all of it is in the
//! buffer, and every declared length is checked against the bounds before any data is awaited,
//! so a client cannot make the server buffer more than `max_frame_bytes` for one command.
//!
//! `max_frame_bytes` bounds the whole command, headers and CRLFs included, in both forms: an
//! array is refused as soon as its declared count (each argument takes at least `$0\r\n\r\n`,
//! 6 bytes) or a declared length puts it over the bound, an inline line once it is longer, and any
//! incomplete command once the buffer holds more than the bound.
//!
//! Two forms, as Redis accepts them: arrays of bulk strings (`*2\r\n$4\r\nPING\r\n...`), which
//! every client library sends, and inline commands (`PING\r\n`), which people type (at most
//! `max_inline_bytes`, 64 KiB by default, as Redis, and never more than `max_frame_bytes`).
//!
//! The [`Decoder`] resumes where its previous call stopped: the arguments already framed and the
//! bytes already searched for a newline are not looked at again, so a command arriving a byte at a
//! time costs O(its length), not O(length²).

use std::ops::Range;

/// Bounds on one command.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Largest command, in bytes, whatever its form.
    pub max_frame_bytes: usize,
    /// Largest inline command, in bytes (the smaller of this and `max_frame_bytes` applies).
    pub max_inline_bytes: usize,
    /// Most arguments.
    pub max_args: usize,
}

/// Why a request cannot be parsed; the connection answers with it and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A malformed `*N` header.
    #[error("invalid multibulk length")]
    MultibulkLength,
    /// More arguments than allowed.
    #[error("too many arguments in one command (at most {0}, --max-args)")]
    TooManyArgs(usize),
    /// A malformed `$N` header, or a missing `$`.
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A malformed or negative bulk length.
    #[error("invalid bulk length")]
    BulkLength,
    /// The command is larger than allowed.
    #[error("command larger than {0} bytes (--max-frame-bytes)")]
    TooBig(usize),
    /// An inline command is longer than allowed.
    #[error("inline command longer than {0} bytes (--max-inline-bytes)")]
    InlineTooBig(usize),
    /// A bulk string not followed by CRLF.
    #[error("bulk string not terminated by CRLF")]
    Unterminated,
}

/// The longest `*N` or `$N` header line we accept (with CRLF): `*` + 20 digits + CRLF.
const MAX_HEADER: usize = 24;

/// The fewest bytes an argument takes: `$0\r\n\r\n`.
const MIN_ARG: usize = 6;

/// Frames commands out of a connection's input buffer, one call per read.
#[derive(Debug, Default)]
pub struct Decoder {
    args: Vec<Range<usize>>,
    /// The arguments announced by the array's `*N` header (None until it is read).
    expected: Option<usize>,
    /// Where framing resumes in the buffer.
    at: usize,
    /// Inline commands: how much of the buffer holds no newline.
    scanned: usize,
    /// The last call returned a complete command: the caller has consumed it since.
    complete: bool,
}

impl Decoder {
    /// Frames the first command in `buf` (which holds what the previous call saw, plus more).
    /// `Ok(Some(n))`: a command of `n` bytes, whose arguments are [`args`](Self::args) (none for a
    /// blank line or `*0`); the caller consumes those `n` bytes before the next call.
    /// `Ok(None)`: more bytes are needed.
    pub fn decode(&mut self, buf: &[u8], bounds: Bounds) -> Result<Option<usize>, ProtocolError> {
        if self.complete {
            self.reset();
        }
        let framed = match buf.first() {
            None => return Ok(None),
            Some(b'*') => self.array(buf, bounds)?,
            Some(_) => self.inline(buf, bounds)?,
        };
        // `buf` starts with this command: unfinished past the bound, it is larger than the bound
        // (a header line still being read, say), whatever it declared so far.
        if framed.is_none() && buf.len() > bounds.max_frame_bytes {
            return Err(ProtocolError::TooBig(bounds.max_frame_bytes));
        }
        self.complete = framed.is_some();
        Ok(framed)
    }

    /// Forgets a command partly framed, to frame another buffer from its start (keeps the
    /// arguments' allocation). A look-ahead that frames whatever follows the command in hand must
    /// reset first: a partial frame describes the bytes it was read from, not the next slice.
    pub fn reset(&mut self) {
        *self = Decoder { args: std::mem::take(&mut self.args), ..Decoder::default() };
        self.args.clear();
    }

    /// The ranges in the buffer of the last complete command's arguments.
    #[must_use]
    pub fn args(&self) -> &[Range<usize>] {
        &self.args
    }

    /// Whether a command is partly framed (its bytes must stay where they are in the buffer).
    #[must_use]
    pub fn in_progress(&self) -> bool {
        !self.complete && (self.at > 0 || self.scanned > 0)
    }

    fn array(&mut self, buf: &[u8], bounds: Bounds) -> Result<Option<usize>, ProtocolError> {
        let expected = match self.expected {
            Some(expected) => expected,
            None => {
                let Some((count, at)) = header(buf, 1, ProtocolError::MultibulkLength)? else { return Ok(None) };
                if count <= 0 {
                    // `*0` and `*-1` are empty commands: skipped, as Redis does.
                    return Ok(Some(at));
                }
                let count = usize::try_from(count).map_err(|_| ProtocolError::MultibulkLength)?;
                if count > bounds.max_args {
                    return Err(ProtocolError::TooManyArgs(bounds.max_args));
                }
                if at.saturating_add(count.saturating_mul(MIN_ARG)) > bounds.max_frame_bytes {
                    return Err(ProtocolError::TooBig(bounds.max_frame_bytes));
                }
                self.expected = Some(count);
                self.at = at;
                count
            }
        };
        while self.args.len() < expected {
            let Some(&kind) = buf.get(self.at) else { return Ok(None) };
            if kind != b'$' {
                return Err(ProtocolError::ExpectedBulk(char::from(kind)));
            }
            let Some((len, start)) = header(buf, self.at + 1, ProtocolError::BulkLength)? else { return Ok(None) };
            let len = usize::try_from(len).map_err(|_| ProtocolError::BulkLength)?;
            // Refuse an oversized command from its declared lengths, before waiting for its data
            // (the command so far, this argument and its CRLF; the arguments still to come were
            // counted once, from `*N`, which is cheaper than here on every argument).
            let end = start.checked_add(len).ok_or(ProtocolError::TooBig(bounds.max_frame_bytes))?;
            if end.saturating_add(2) > bounds.max_frame_bytes {
                return Err(ProtocolError::TooBig(bounds.max_frame_bytes));
            }
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ProtocolError::Unterminated);
            }
            self.args.push(start..end);
            self.at = end + 2;
        }
        Ok(Some(self.at))
    }

    fn inline(&mut self, buf: &[u8], bounds: Bounds) -> Result<Option<usize>, ProtocolError> {
        // The line, newline included, fits the smaller bound; the error names the one that applied.
        let (bound, too_big) = if bounds.max_frame_bytes < bounds.max_inline_bytes {
            (bounds.max_frame_bytes, ProtocolError::TooBig(bounds.max_frame_bytes))
        } else {
            (bounds.max_inline_bytes, ProtocolError::InlineTooBig(bounds.max_inline_bytes))
        };
        let limit = buf.len().min(bound);
        let Some(found) = buf[self.scanned.min(limit)..limit].iter().position(|&b| b == b'\n') else {
            if buf.len() >= bound {
                return Err(too_big);
            }
            self.scanned = limit;
            return Ok(None);
        };
        let newline = self.scanned.min(limit) + found;
        let line_end = if newline > 0 && buf[newline - 1] == b'\r' { newline - 1 } else { newline };
        let mut at = 0;
        while at < line_end {
            while at < line_end && buf[at].is_ascii_whitespace() {
                at += 1;
            }
            let start = at;
            while at < line_end && !buf[at].is_ascii_whitespace() {
                at += 1;
            }
            if at > start {
                if self.args.len() == bounds.max_args {
                    return Err(ProtocolError::TooManyArgs(bounds.max_args));
                }
                self.args.push(start..at);
            }
        }
        Ok(Some(newline + 1))
    }
}

/// Frames the first command in `buf` with a fresh [`Decoder`]: the arguments' ranges go into
/// `args`. For tests and fuzzing; connections keep one decoder.
pub fn parse(buf: &[u8], args: &mut Vec<Range<usize>>, bounds: Bounds) -> Result<Option<usize>, ProtocolError> {
    let mut decoder = Decoder::default();
    let framed = decoder.decode(buf, bounds);
    args.clear();
    args.extend_from_slice(decoder.args());
    framed
}

/// The number on a header line starting at `at` (after its type byte), and where the next line
/// starts. `Ok(None)`: the line is not complete yet.
fn header(buf: &[u8], at: usize, error: ProtocolError) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[at.min(buf.len())..buf.len().min(at + MAX_HEADER)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        return if window.len() >= MAX_HEADER { Err(error) } else { Ok(None) };
    };
    let Some(&next) = buf.get(at + cr + 1) else { return Ok(None) };
    if next != b'\n' {
        return Err(error);
    }
    let text = std::str::from_utf8(&window[..cr]).map_err(|_| error.clone())?;
    let value = text.parse::<i64>().map_err(|_| error)?;
    Ok(Some((value, at + cr + 2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds { max_frame_bytes: 1 << 16, max_inline_bytes: 1 << 10, max_args: 8 };

    type Parsed<'a> = Option<(Vec<&'a [u8]>, usize)>;

    fn words(input: &[u8]) -> Result<Parsed<'_>, ProtocolError> {
        let mut args = Vec::new();
        Ok(parse(input, &mut args, BOUNDS)?.map(|used| (args.iter().map(|r| &input[r.clone()]).collect(), used)))
    }

    #[test]
    fn parses_arrays_inline_and_waits_for_the_rest() {
        let (args, used) = words(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*1\r\n").unwrap().unwrap();
        assert_eq!((args, used), (vec![&b"ECHO"[..], b"hi"], 22));
        let (args, used) = words(b"  PING  hello \r\nnext").unwrap().unwrap();
        assert_eq!((args, used), (vec![&b"PING"[..], b"hello"], 16));
        for partial in [&b"*2\r\n$4\r\nECHO\r\n$2\r\nh"[..], b"*2\r\n$4\r", b"*", b"PING", b"*1\r\n$4\r\nPING\r"] {
            assert_eq!(words(partial), Ok(None), "{partial:?}");
        }
        assert_eq!(words(b"*0\r\n").unwrap().unwrap().1, 4);
        assert_eq!(words(b"\r\n").unwrap().unwrap(), (vec![], 2));
    }

    #[test]
    fn refuses_malformed_and_oversized_input_early() {
        assert_eq!(words(b"*x\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(words(b"*9\r\n"), Err(ProtocolError::TooManyArgs(8)));
        assert_eq!(words(b"*1\r\n:4\r\n"), Err(ProtocolError::ExpectedBulk(':')));
        assert_eq!(words(b"*1\r\n$-3\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(words(b"*1\r\n$4\r\nPINGxx"), Err(ProtocolError::Unterminated));
        // A 2 GB bulk is refused from its header alone.
        assert_eq!(words(b"*1\r\n$2000000000\r\n"), Err(ProtocolError::TooBig(1 << 16)));
        assert_eq!(words(b"*1\r\n$99999999999999999999999\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(words(b"*100000000000000000000000000\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(words(&vec![b'a'; 1 << 10]), Err(ProtocolError::InlineTooBig(1 << 10)));
    }

    /// The frame bound is on the whole command, in both forms, and refuses what its declared
    /// count or lengths put over it before the rest arrives.
    #[test]
    fn the_frame_bound_is_on_whole_commands() {
        let bounds = Bounds { max_frame_bytes: 20, max_inline_bytes: 1 << 10, max_args: 64 };
        let frame = |input: &[u8]| parse(input, &mut Vec::new(), bounds);
        let too_big = Err(ProtocolError::TooBig(20));
        assert_eq!(frame(b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n"), Ok(Some(20)));
        assert_eq!(frame(b"*2\r\n$4\r\nECHO\r\n$1\r\n"), too_big, "21 bytes declared");
        assert_eq!(frame(b"*3\r\n$4\r\nECHO\r\n"), too_big, "a third argument cannot fit");
        assert_eq!(frame(b"*3\r\n"), too_big, "three arguments need at least 22 bytes");
        assert_eq!(frame(b"ECHO aaaaaaaaaaaaa\r\n"), Ok(Some(20)));
        assert_eq!(frame(b"ECHO aaaaaaaaaaaaaa\r\n"), too_big);
        assert_eq!(frame(b"ECHO aaaaaaaaaaaaaaa"), too_big, "no newline within the bound");
        // A header line still open past the bound.
        assert_eq!(frame(b"*1\r\n$0000000000000000001"), too_big);
        // The inline bound, when it is the smaller one, is named as such.
        let inline = Bounds { max_frame_bytes: 1 << 10, max_inline_bytes: 8, ..bounds };
        assert_eq!(parse(b"ECHO abcd\r\n", &mut Vec::new(), inline), Err(ProtocolError::InlineTooBig(8)));
    }

    /// A command dribbled in a byte at a time: each call looks only at what is new (the old parser
    /// rescanned the whole buffer on every read, quadratic in the command's length).
    #[test]
    fn a_decoder_resumes_where_it_stopped() {
        let command: Vec<u8> = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n".to_vec();
        let mut decoder = Decoder::default();
        let mut framed = None;
        for end in 1..=command.len() {
            if let Some(used) = decoder.decode(&command[..end], BOUNDS).unwrap() {
                framed = Some((end, used));
                break;
            }
        }
        let (end, used) = framed.unwrap();
        assert_eq!((end, used), (31, 31));
        let args: Vec<&[u8]> = decoder.args().iter().map(|r| &command[r.clone()]).collect();
        assert_eq!(args, [&b"SET"[..], b"k", b"hello"]);
        let rest = &command[used..];
        for end in 1..rest.len() {
            assert_eq!(decoder.decode(&rest[..end], BOUNDS), Ok(None));
            assert!(decoder.in_progress());
        }
        assert_eq!(decoder.decode(rest, BOUNDS), Ok(Some(6)));
        assert_eq!(decoder.args().len(), 1);
    }
}

/// Fuzzing by property: arbitrary bytes never panic the parser, never claim more bytes than
/// given, and any command encoded as an array parses back to itself, whatever the chunking.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    const BOUNDS: Bounds = Bounds { max_frame_bytes: 4096, max_inline_bytes: 1024, max_args: 16 };

    fn encode(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend(format!("${}\r\n", arg.len()).bytes());
            out.extend(arg);
            out.extend(b"\r\n");
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut args = Vec::new();
            if let Ok(Some(used)) = parse(&bytes, &mut args, BOUNDS) {
                prop_assert!(used <= bytes.len());
                prop_assert!(args.iter().all(|r| r.end <= used));
            }
        }

        #[test]
        fn headers_with_noise_never_panic(
            prefix in prop_oneof![Just(b"*".to_vec()), Just(b"*2\r\n$".to_vec()), Just(b"*1\r\n$3\r\n".to_vec())],
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = prefix;
            bytes.extend(noise);
            let mut args = Vec::new();
            let _ = parse(&bytes, &mut args, BOUNDS);
        }

        #[test]
        fn encoded_commands_parse_back(
            command in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..10),
            cut in 0usize..1000,
        ) {
            let bytes = encode(&command);
            let mut args = Vec::new();
            let used = parse(&bytes, &mut args, BOUNDS).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            let parsed: Vec<Vec<u8>> = args.iter().map(|r| bytes[r.clone()].to_vec()).collect();
            prop_assert_eq!(&parsed, &command);
            // Any strict prefix is incomplete, never an error.
            let cut = cut % bytes.len();
            prop_assert_eq!(parse(&bytes[..cut], &mut args, BOUNDS), Ok(None));
            // Fed in two pieces to one decoder, the same command.
            let mut decoder = Decoder::default();
            prop_assert_eq!(decoder.decode(&bytes[..cut], BOUNDS), Ok(None));
            prop_assert_eq!(decoder.decode(&bytes, BOUNDS), Ok(Some(bytes.len())));
            let again: Vec<Vec<u8>> = decoder.args().iter().map(|r| bytes[r.clone()].to_vec()).collect();
            prop_assert_eq!(again, command);
        }
    }
}
