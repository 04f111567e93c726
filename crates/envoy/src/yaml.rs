//! The YAML document as written: envoyproxy/ratelimit's fields, tollgate's extensions, and
//! nothing else (an unknown or misplaced field is an error).
//!
//! Strings are taken as written, as envoyproxy/ratelimit's YAML 1.1 parser gives them to a string
//! field: `value: 0123` is the text `0123`, not the number 123, and `value: 200` is `200`.
//! Booleans accept YAML 1.1's spellings too (`yes`, `on`, ...). A syntax or type error names the
//! descriptor path, recovered from the document, with the parser's line and column.

use serde::{Deserialize, Deserializer, de};
use serde_path_to_error::Segment;

use crate::error::{ConfigError, segment};

/// The whole document.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `domain` and `descriptors`")]
pub(crate) struct RawRoot {
    pub(crate) domain: Option<String>,
    pub(crate) descriptors: Option<Vec<RawDescriptor>>,
}

/// One entry of a `descriptors` list.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a descriptor: a mapping with `key` and optionally `value`, `rate_limit`, ..."
)]
pub(crate) struct RawDescriptor {
    pub(crate) key: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RawRateLimit>,
    pub(crate) descriptors: Option<Vec<RawDescriptor>>,
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub(crate) shadow_mode: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub(crate) quota_mode: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub(crate) detailed_metric: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub(crate) value_to_metric: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub(crate) share_threshold: bool,
    pub(crate) metadata: Option<serde_json::Value>,
}

/// A `rate_limit` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `unit` and `requests_per_unit`, or `unlimited: true`")]
pub(crate) struct RawRateLimit {
    pub(crate) unit: Option<String>,
    pub(crate) requests_per_unit: Option<u32>,
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub(crate) unlimited: bool,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Option<Vec<RawReplaces>>,
    /// tollgate extension: the algorithm (default fixed-window).
    pub(crate) algorithm: Option<String>,
    /// tollgate extension: the bucket family's burst.
    pub(crate) burst: Option<u64>,
    /// tollgate extension: the sub-window counter's slices.
    pub(crate) slices: Option<u64>,
    /// tollgate extension: an IANA time zone; with it `day`, `week`, `month` and `year` are
    /// calendar units of that zone (without it, envoyproxy/ratelimit's fixed lengths).
    pub(crate) tz: Option<String>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with `name`")]
pub(crate) struct RawReplaces {
    pub(crate) name: Option<String>,
}

/// A boolean as YAML 1.1 (envoyproxy/ratelimit's parser) reads one; null is false, as there.
fn yaml11_bool<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    struct Visitor;
    impl de::Visitor<'_> for Visitor {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a boolean (true or false)")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Ok(true),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Ok(false),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }
    deserializer.deserialize_any(Visitor)
}

/// Parses one document; an error names the descriptor path where the parser stopped.
pub(crate) fn parse(yaml: &str, origin: &str) -> Result<RawRoot, ConfigError> {
    let deserializer = serde_norway::Deserializer::from_str(yaml);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let location = e.inner().location().map(|l| (l.line(), l.column()));
        let (path, field) = describe(yaml, e.path());
        let reason = bare_message(&e.inner().to_string(), location);
        let reason = if field.is_empty() { reason } else { format!("{field}: {reason}") };
        ConfigError::new(origin, path, reason).at(location)
    })
}

/// The parser's message without the position and the path it prepends (we give both our way).
fn bare_message(message: &str, location: Option<(usize, usize)>) -> String {
    let mut text = message;
    if let Some((line, column)) = location {
        text = text.strip_suffix(&format!(" at line {line} column {column}")).unwrap_or(text);
    }
    if let Some((head, rest)) = text.split_once(": ")
        && !head.is_empty()
        && !head.contains(char::is_whitespace)
    {
        text = rest;
    }
    text.to_owned()
}

/// Splits the parser's path (`descriptors[0].descriptors[2].rate_limit.unit`) into the
/// descriptor path (`domain > key=value > key`), read from the document, and the rest
/// (`rate_limit.unit`).
fn describe(yaml: &str, path: &serde_path_to_error::Path) -> (String, String) {
    // Only reached for a document already refused, so parsing it once more costs nothing that matters.
    let tree: Option<serde_norway::Value> = serde_norway::from_str(yaml).ok();
    let mut node = tree.as_ref();
    let mut parts: Vec<String> = Vec::new();
    if let Some(domain) = node.and_then(|n| n.get("domain")).and_then(scalar_text) {
        parts.push(domain);
    }
    let segments: Vec<&Segment> = path.iter().collect();
    let mut i = 0;
    while let (Some(Segment::Map { key }), Some(Segment::Seq { index })) = (segments.get(i), segments.get(i + 1)) {
        if key != "descriptors" {
            break;
        }
        node = node.and_then(|n| n.get("descriptors")).and_then(|list| list.get(*index));
        let key = node.and_then(|n| n.get("key")).and_then(scalar_text).filter(|k| !k.is_empty());
        let value = node.and_then(|n| n.get("value")).and_then(scalar_text).filter(|v| !v.is_empty());
        parts.push(match key {
            Some(key) => segment(&key, value.as_deref()),
            None => format!("descriptors[{index}]"),
        });
        i += 2;
    }
    let field: Vec<String> = segments[i..]
        .iter()
        .map(|s| match s {
            Segment::Seq { index } => format!("[{index}]"),
            Segment::Map { key } | Segment::Enum { variant: key } => format!(".{key}"),
            Segment::Unknown => ".?".to_owned(),
        })
        .collect();
    (parts.join(" > "), field.concat().trim_start_matches('.').to_owned())
}

/// A scalar's text, for naming a descriptor in an error.
fn scalar_text(value: &serde_norway::Value) -> Option<String> {
    match value {
        serde_norway::Value::String(s) => Some(s.clone()),
        serde_norway::Value::Number(n) => Some(n.to_string()),
        serde_norway::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_taken_as_written() {
        let root = parse("domain: 007\ndescriptors:\n  - key: code\n    value: 0123\n", "t").unwrap();
        assert_eq!(root.domain.as_deref(), Some("007"));
        assert_eq!(root.descriptors.unwrap()[0].value.as_deref(), Some("0123"));
    }

    #[test]
    fn yaml11_booleans() {
        let root =
            parse("descriptors:\n  - {key: a, shadow_mode: yes, detailed_metric: Off, quota_mode: ~}\n", "t").unwrap();
        let d = &root.descriptors.unwrap()[0];
        assert!(d.shadow_mode && !d.detailed_metric && !d.quota_mode);
        let e = parse("descriptors:\n  - {key: a, shadow_mode: maybe}\n", "t").unwrap_err();
        assert!(e.reason().starts_with("shadow_mode: invalid value"), "{e}");
    }

    #[test]
    fn errors_name_the_descriptor_path_and_the_field() {
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    value: b\n    descriptors:\n      - key: c\n        rate_limit:\n          unti: second\n";
        let e = parse(yaml, "f.yaml").unwrap_err();
        assert_eq!(e.path(), "d > a=b > c");
        assert_eq!(e.location(), Some((8, 11)));
        assert!(e.reason().starts_with("rate_limit.unti: unknown field `unti`, expected one of"), "{e}");
        let e =
            parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: -1}\n", "f").unwrap_err();
        assert_eq!(e.path(), "d > a");
        assert!(e.reason().starts_with("rate_limit.requests_per_unit: invalid type: integer `-1`"), "{e}");
        let e = parse("domain: d\nrate_limit: {}\n", "f").unwrap_err();
        assert_eq!((e.path(), e.location()), ("d", Some((2, 1))));
        let e = parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: 5\n", "f").unwrap_err();
        assert_eq!(
            e.reason(),
            "rate_limit: invalid type: integer `5`, expected a mapping with `unit` and `requests_per_unit`, or `unlimited: true`"
        );
        let e = parse("hello", "f").unwrap_err();
        assert_eq!(e.reason(), "invalid type: string \"hello\", expected a mapping with `domain` and `descriptors`");
        let e = parse("domain: [\n", "f").unwrap_err();
        assert_eq!(e.path(), "");
        assert!(e.location().is_some(), "{e}");
    }
}
