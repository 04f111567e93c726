//! Regular-expression matches (`path_regex`, `host_regex`, `header_regex`): compiled once, when
//! the rules load, by the `regex` crate, whose matching is linear in the input whatever the
//! pattern (no backtracking: a pattern cannot be a ReDoS). A pattern is a **full match**, as
//! Envoy's `safe_regex`: it must match the whole path, host or header value, so a missing `^` or
//! `$` cannot widen a rule. Patterns match bytes (Unicode mode off): `.` and negated classes match
//! any byte, so a header value that is not UTF-8 is matched, never skipped; `\w`, `\d`, `\s` and
//! `(?i)` are ASCII.

use serde::Deserialize;

/// The longest pattern accepted, in bytes.
pub(super) const MAX_PATTERN: usize = 4096;
/// The most memory a compiled pattern may take (the program, and the lazy DFA's cache).
pub(super) const MAX_COMPILED: usize = 1 << 20;

/// A pattern, compiled: a full match on bytes.
#[derive(Debug, Clone)]
pub struct Regex {
    /// As written.
    text: String,
    case_insensitive: bool,
    compiled: regex::bytes::Regex,
}

impl PartialEq for Regex {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.case_insensitive == other.case_insensitive
    }
}

impl Eq for Regex {}

impl Regex {
    /// `text` compiled as a full match, ASCII letters in any case if `case_insensitive`; refused
    /// if longer than [`MAX_PATTERN`], not a pattern, or larger than [`MAX_COMPILED`] compiled.
    pub fn new(text: &str, case_insensitive: bool) -> Result<Regex, String> {
        if text.len() > MAX_PATTERN {
            return Err(format!("longer than {MAX_PATTERN} bytes ({} bytes)", text.len()));
        }
        let build = |pattern: &str| {
            regex::bytes::RegexBuilder::new(pattern)
                .unicode(false)
                .case_insensitive(case_insensitive)
                .size_limit(MAX_COMPILED)
                .dfa_size_limit(MAX_COMPILED)
                .build()
                .map_err(|e| match e {
                    regex::Error::CompiledTooBig(_) => format!("larger than {} KiB compiled", MAX_COMPILED >> 10),
                    e => format!("not a valid pattern: {e}"),
                })
        };
        // The pattern alone first, so that an error quotes it as written (an error in it is one
        // in it anchored; a pattern too large alone is too large anchored).
        build(text)?;
        // `(?:...)` keeps the pattern's own alternatives and flags inside the anchors.
        let compiled = build(&format!(r"\A(?:{text})\z"))?;
        Ok(Regex { text: text.to_string(), case_insensitive, compiled })
    }

    /// The pattern as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The same pattern with ASCII letters in any case.
    pub(crate) fn case_insensitive(&self) -> Result<Regex, String> {
        Regex::new(&self.text, true)
    }

    /// Whether the whole of `haystack` matches.
    #[must_use]
    pub fn matches(&self, haystack: &[u8]) -> bool {
        self.compiled.is_match(haystack)
    }
}

/// Deserializes a pattern, as written (its case as written).
pub(super) fn exact_case<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Regex>, D::Error> {
    let text = String::deserialize(deserializer)?;
    Regex::new(&text, false).map(Some).map_err(|e| serde::de::Error::custom(format!("path_regex {text:?}: {e}")))
}

/// Deserializes a host pattern: hosts are case-insensitive.
pub(super) fn any_case<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Regex>, D::Error> {
    let text = String::deserialize(deserializer)?;
    Regex::new(&text, true).map(Some).map_err(|e| serde::de::Error::custom(format!("host_regex {text:?}: {e}")))
}

/// `{ name = "user-agent", pattern = "curl/.*" }`: a header with a line the pattern matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderRegex {
    /// The header's name (case-insensitive).
    pub name: String,
    /// The pattern, a full match on one of its lines, case as written.
    pub pattern: Regex,
}

impl<'de> Deserialize<'de> for HeaderRegex {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Written {
            name: String,
            pattern: String,
        }
        let Written { name, pattern } = Written::deserialize(deserializer)?;
        let compiled = Regex::new(&pattern, false)
            .map_err(|e| serde::de::Error::custom(format!("header_regex {pattern:?}: {e}")))?;
        Ok(HeaderRegex { name, pattern: compiled })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_the_whole_input() {
        let r = Regex::new("/users/[0-9]+", false).unwrap();
        assert!(r.matches(b"/users/42"));
        assert!(!r.matches(b"/users/42/orders"), "no $ needed: a full match");
        assert!(!r.matches(b"/x/users/42"), "no ^ needed: a full match");
        let alternatives = Regex::new("/a|/b", false).unwrap();
        assert!(alternatives.matches(b"/a") && alternatives.matches(b"/b"));
        assert!(!alternatives.matches(b"/ab") && !alternatives.matches(b"/a/b"), "the anchors hold every alternative");
    }

    /// A pattern is checked alone before it is anchored: it cannot close the anchoring group
    /// and add an alternative outside the anchors.
    #[test]
    fn a_pattern_cannot_escape_its_anchors() {
        let error = Regex::new("/x)|(?:.*", false).unwrap_err();
        assert!(error.starts_with("not a valid pattern: "), "{error}");
    }

    #[test]
    fn case_is_as_written_unless_asked() {
        assert!(!Regex::new("/Admin", false).unwrap().matches(b"/admin"));
        assert!(Regex::new("/Admin", true).unwrap().matches(b"/ADMIN"));
        assert!(Regex::new("(?i)/Admin", false).unwrap().matches(b"/aDmIn"));
    }

    #[test]
    fn bytes_that_are_not_utf8_are_matched() {
        let r = Regex::new(".*bot.*", false).unwrap();
        assert!(r.matches(b"\xff\xfe mybot/1.0 \xc3"), "a byte that is not UTF-8 cannot hide a match");
        assert!(Regex::new("caf\u{e9}", false).unwrap().matches("caf\u{e9}".as_bytes()));
        assert!(!Regex::new("[^x]", false).unwrap().matches(b"\xff\xff"), "one byte, not two");
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        let invalid = Regex::new("/users/(", false).unwrap_err();
        assert!(invalid.starts_with("not a valid pattern: regex parse error:\n    /users/(\n"), "{invalid}");
        let long = Regex::new(&"a".repeat(MAX_PATTERN + 1), false).unwrap_err();
        assert_eq!(long, format!("longer than 4096 bytes ({} bytes)", MAX_PATTERN + 1));
        let big = Regex::new("[a-z]{1000}{1000}", false).unwrap_err();
        assert_eq!(big, "larger than 1024 KiB compiled");
        assert!(Regex::new(&"a".repeat(MAX_PATTERN), false).is_ok());
    }

    /// Matching is linear: the pattern that backtracks exponentially elsewhere answers at once.
    #[test]
    fn a_classic_redos_pattern_is_linear() {
        let r = Regex::new("(a+)+b", false).unwrap();
        assert!(!r.matches("a".repeat(100_000).as_bytes()));
    }
}
