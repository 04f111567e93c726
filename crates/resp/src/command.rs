//! A client's commands: arrays of bulk strings (`*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n`), the form
//! every client library sends. A caller that renders its arguments in place (the load
//! generator's key templates) writes the headers itself with [`array_header`] and
//! [`bulk_header`].

/// Appends `*n\r\n`.
pub fn array_header(n: usize, out: &mut Vec<u8>) {
    out.push(b'*');
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `$len\r\n` (the argument's bytes and `\r\n` follow).
pub fn bulk_header(len: usize, out: &mut Vec<u8>) {
    out.push(b'$');
    out.extend_from_slice(len.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends the command made of `args`.
pub fn encode<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    array_header(args.len(), out);
    for arg in args {
        let arg = arg.as_ref();
        bulk_header(arg.len(), out);
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// The command `line` as redis-cli splits it: words on whitespace, `"…"` or `'…'` quoting a word
/// with spaces (no escapes).
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else { return Ok(words) };
        let mut word = String::new();
        if first == '"' || first == '\'' {
            chars.next();
            loop {
                match chars.next() {
                    Some(c) if c == first => break,
                    Some(c) => word.push(c),
                    None => return Err(format!("unbalanced {first} in {line:?}")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                word.push(c);
            }
        }
        words.push(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&["INCR", "k", ""], &mut out);
        assert_eq!(out, b"*3\r\n$4\r\nINCR\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn words_split_like_redis_cli() {
        assert_eq!(split_words(r#"  SET "a b" 'c'  d"#).unwrap(), ["SET", "a b", "c", "d"]);
        assert!(split_words("GET \"open").unwrap_err().contains("unbalanced"));
        assert!(split_words("   ").unwrap().is_empty());
    }
}
