//! One domain's descriptor tree: built from the YAML with every check envoyproxy/ratelimit makes
//! (and tollgate's bounds), and walked for a request's descriptor.
//!
//! At each level, an entry `(key, value)` goes to the child with that key and exactly that value,
//! else to the first (in file order) child of that key whose wildcard value matches, else to the
//! child of that key without a value. A limit applies only at the node the descriptor's last entry
//! reaches: a shorter or longer descriptor matches nothing (envoyproxy/ratelimit's `GetLimit`).

use std::collections::HashMap;

use serde_json::Value;
use smallvec::SmallVec;

use crate::error::{ConfigError, segment};
use crate::limit::{RateLimit, Unit, limit_for, too_long};
use crate::yaml::{RawDescriptor, RawRateLimit};
use crate::{MAX_DEPTH, MAX_DESCRIPTORS, MAX_REPLACES, MAX_TEXT_BYTES, MAX_WILDCARDS};
use tollgate_core::LimitSpec;

/// A descriptor node: its limit, its flags and its children by key.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub(crate) limit: Option<RateLimit>,
    value_to_metric: bool,
    share_threshold: bool,
    children: HashMap<String, Branch>,
}

/// The children of one node that share a key.
#[derive(Debug, Default)]
struct Branch {
    /// By configured value, wildcard patterns included: a request value equal to a pattern's
    /// text matches it exactly, as in envoyproxy/ratelimit.
    exact: HashMap<String, Node>,
    /// The values containing `*`, in file order: the first that matches wins.
    wildcards: Vec<Glob>,
    /// The child without a value (one bucket per request value).
    any: Option<Box<Node>>,
}

/// How an entry reached its node, for the state key and the metric key.
#[derive(Debug, Clone, Copy)]
enum Via<'a> {
    Exact,
    Wildcard(&'a str),
    Any,
}

/// A value pattern: `*` matches any run of characters (none included), anywhere and repeatedly.
#[derive(Debug)]
struct Glob {
    pattern: String,
    /// What the value starts with, what it ends with, and what must appear in order between them
    /// (the pattern split at each `*`).
    first: String,
    last: String,
    middle: Vec<String>,
    fixed: usize,
}

impl Glob {
    /// The pattern as a glob; `None` without a `*`.
    fn new(pattern: &str) -> Option<Glob> {
        let mut parts: Vec<String> = pattern.split('*').map(str::to_owned).collect();
        let fixed = parts.iter().map(String::len).sum();
        let last = parts.pop().filter(|_| !parts.is_empty())?;
        let first = parts.remove(0);
        Some(Glob { pattern: pattern.to_owned(), first, last, middle: parts, fixed })
    }

    fn matches(&self, value: &str) -> bool {
        let (first, last, middle) = (&self.first, &self.last, &self.middle);
        if value.len() < self.fixed {
            return false; // the prefix and the suffix would overlap
        }
        let Some(mut between) = value.strip_prefix(first.as_str()).and_then(|v| v.strip_suffix(last.as_str())) else {
            return false;
        };
        // Leftmost matches leave the most room for the parts after them.
        for part in middle {
            match between.find(part.as_str()) {
                Some(at) => between = &between[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// What building a domain needs to report errors and enforce its bounds.
pub(crate) struct Builder<'o> {
    origin: &'o str,
    path: Vec<String>,
    descriptors: usize,
}

impl<'o> Builder<'o> {
    pub(crate) fn new(origin: &'o str, domain: &str) -> Builder<'o> {
        Builder { origin, path: vec![domain.to_owned()], descriptors: 0 }
    }

    fn error(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::new(self.origin, self.path.join(" > "), reason)
    }

    /// The root node of a domain whose top-level list is `descriptors`.
    pub(crate) fn root(&mut self, descriptors: Vec<RawDescriptor>) -> Result<Node, ConfigError> {
        Ok(Node { children: self.level(descriptors, 1)?, ..Node::default() })
    }

    fn level(&mut self, descriptors: Vec<RawDescriptor>, depth: usize) -> Result<HashMap<String, Branch>, ConfigError> {
        let mut children: HashMap<String, Branch> = HashMap::new();
        for (index, raw) in descriptors.into_iter().enumerate() {
            let key = raw.key.clone().unwrap_or_default();
            let value = raw.value.clone().filter(|v| !v.is_empty());
            if key.is_empty() {
                self.path.push(format!("descriptors[{index}]"));
                return Err(self.error("descriptor has no `key` (or an empty one)"));
            }
            self.path.push(segment(&key, value.as_deref()));
            let node = self.descriptor(raw, value.as_deref(), depth)?;
            let branch = children.entry(key).or_default();
            match value {
                None if branch.any.is_some() => {
                    return Err(self.error("duplicate descriptor: defined twice at this level"));
                }
                None => branch.any = Some(Box::new(node)),
                Some(value) => {
                    if branch.exact.contains_key(&value) {
                        return Err(self.error("duplicate descriptor: defined twice at this level"));
                    }
                    if let Some(glob) = Glob::new(&value) {
                        if branch.wildcards.len() == MAX_WILDCARDS {
                            return Err(self.error(format!(
                                "more than {MAX_WILDCARDS} wildcard values for this key at this level"
                            )));
                        }
                        branch.wildcards.push(glob);
                    }
                    branch.exact.insert(value, node);
                }
            }
            self.path.pop();
        }
        Ok(children)
    }

    fn descriptor(&mut self, raw: RawDescriptor, value: Option<&str>, depth: usize) -> Result<Node, ConfigError> {
        self.descriptors += 1;
        if self.descriptors > MAX_DESCRIPTORS {
            return Err(self.error(format!("more than {MAX_DESCRIPTORS} descriptors in one domain")));
        }
        if depth > MAX_DEPTH {
            return Err(self.error(format!("descriptors nested deeper than {MAX_DEPTH} levels")));
        }
        let key_len = raw.key.as_ref().map_or(0, String::len);
        if key_len.max(value.map_or(0, str::len)) > MAX_TEXT_BYTES {
            return Err(self.error(format!("key or value longer than {MAX_TEXT_BYTES} bytes")));
        }
        if raw.share_threshold && !value.is_some_and(|v| v.contains('*')) {
            return Err(self.error("share_threshold applies only to a wildcard value (one containing `*`)"));
        }
        let metadata = match raw.metadata {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map),
            Some(_) => return Err(self.error("metadata must be a mapping")),
        };
        let limit = match raw.rate_limit {
            Some(rate_limit) => {
                let flags = Flags {
                    shadow_mode: raw.shadow_mode,
                    quota_mode: raw.quota_mode,
                    detailed_metric: raw.detailed_metric,
                };
                Some(self.rate_limit(rate_limit, &flags, metadata)?)
            }
            None => None,
        };
        let children = self.level(raw.descriptors.unwrap_or_default(), depth + 1)?;
        Ok(Node { limit, value_to_metric: raw.value_to_metric, share_threshold: raw.share_threshold, children })
    }

    fn rate_limit(
        &self,
        raw: RawRateLimit,
        flags: &Flags,
        metadata: Option<serde_json::Map<String, Value>>,
    ) -> Result<RateLimit, ConfigError> {
        let unit_text = raw.unit.clone().unwrap_or_default();
        let name = raw.name.filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for entry in raw.replaces.unwrap_or_default() {
            let Some(replaced) = entry.name.filter(|n| !n.is_empty()) else {
                return Err(self.error("rate_limit.replaces: an entry has no `name` (or an empty one)"));
            };
            if name.as_ref() == Some(&replaced) {
                return Err(self.error(format!("rate_limit.replaces: a limit cannot replace itself ({replaced:?})")));
            }
            replaces.push(replaced);
        }
        if replaces.len() > MAX_REPLACES {
            return Err(self.error(format!("rate_limit.replaces: more than {MAX_REPLACES} names")));
        }
        if [&name].into_iter().flatten().chain(&replaces).any(|n| n.len() > MAX_TEXT_BYTES) {
            return Err(self.error(format!("rate_limit: a name longer than {MAX_TEXT_BYTES} bytes")));
        }
        let requests_per_unit = raw.requests_per_unit.unwrap_or(0);
        let mut rate_limit = RateLimit {
            name,
            unit: Unit::Second,
            requests_per_unit,
            unlimited: raw.unlimited,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
            replaces,
            metadata,
            limit: None,
        };
        if raw.unlimited {
            if !unit_text.is_empty() {
                return Err(self.error("rate_limit: `unit` must not be set when `unlimited: true`"));
            }
            if raw.algorithm.is_some() || raw.burst.is_some() || raw.slices.is_some() {
                return Err(
                    self.error("rate_limit: `algorithm`, `burst` and `slices` do not apply to `unlimited: true`")
                );
            }
            return Ok(rate_limit);
        }
        let Some(unit) = Unit::parse(&unit_text) else {
            let what =
                if unit_text.is_empty() { "missing `unit`".to_owned() } else { format!("invalid unit {unit_text:?}") };
            return Err(self.error(format!(
                "rate_limit: {what} (expected second, minute, hour, day, week, month or year, or `unlimited: true`)"
            )));
        };
        rate_limit.unit = unit;
        let mut tuning = LimitSpec { burst: raw.burst, slices: raw.slices, tz: raw.tz.clone(), ..LimitSpec::default() };
        if let Some(algorithm) = &raw.algorithm {
            let algorithm = algorithm.parse().map_err(|e| self.error(format!("rate_limit.algorithm: {e}")))?;
            tuning.algorithm = Some(algorithm);
        }
        if requests_per_unit == 0 && (raw.burst.is_some() || raw.slices.is_some()) {
            return Err(self.error(
                "rate_limit: `burst` and `slices` do not apply to `requests_per_unit: 0` (every request is over the limit)",
            ));
        }
        if requests_per_unit > 0 && too_long(unit) && raw.tz.is_none() {
            return Err(self.error(format!(
                "rate_limit: unit {unit} read as envoyproxy/ratelimit does ({} days from the epoch) is longer than \
                 a fixed tollgate period (50 days); add `tz: UTC` (or another zone) to count calendar years, \
                 or use a shorter unit, e.g. {} per month",
                unit.seconds() / 86_400,
                (u64::from(requests_per_unit) * 30).div_ceil(365)
            )));
        }
        rate_limit.limit =
            limit_for(requests_per_unit, unit, &tuning).map_err(|e| self.error(format!("rate_limit: {e}")))?;
        Ok(rate_limit)
    }
}

/// The descriptor flags that belong to its limit.
struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
}

/// A descriptor's matched limit, its state key and its metric key.
pub(crate) struct Found<'a> {
    pub(crate) limit: &'a RateLimit,
    pub(crate) key: Vec<u8>,
    pub(crate) metric_key: String,
}

impl Node {
    fn child(&self, key: &str, value: &str) -> Option<(&Node, Via<'_>)> {
        let branch = self.children.get(key)?;
        if let Some(node) = branch.exact.get(value) {
            return Some((node, Via::Exact));
        }
        if let Some(glob) = branch.wildcards.iter().find(|g| g.matches(value)) {
            return Some((&branch.exact[&glob.pattern], Via::Wildcard(&glob.pattern)));
        }
        branch.any.as_deref().map(|node| (node, Via::Any))
    }

    /// The limit of the node `entries` lead to from this root, if every entry matches and that
    /// node has one.
    pub(crate) fn find<'a>(&'a self, domain: &str, entries: &[(&str, &str)]) -> Option<Found<'a>> {
        let mut steps: SmallVec<[(&'a Node, Via<'a>); 8]> = SmallVec::new();
        let mut node = self;
        for (key, value) in entries {
            let (next, via) = node.child(key, value)?;
            steps.push((next, via));
            node = next;
        }
        let limit = node.limit.as_ref()?;
        // Entries matched by a shared wildcard count under the pattern, so all its values share one state.
        let shared = |(node, via): &(&'a Node, Via<'a>)| match via {
            Via::Wildcard(pattern) if node.share_threshold => Some(*pattern),
            _ => None,
        };
        let mut key = Vec::new();
        frame(&mut key, domain.as_bytes());
        for ((k, v), step) in entries.iter().zip(&steps) {
            frame(&mut key, k.as_bytes());
            frame(&mut key, shared(step).unwrap_or(v).as_bytes());
        }
        let mut metric_key = domain.to_owned();
        let any_shared = steps.iter().any(|s| shared(s).is_some());
        for ((k, v), step @ (node, via)) in entries.iter().zip(&steps) {
            metric_key.push('.');
            metric_key.push_str(k);
            let suffix: &str = match (limit.detailed_metric, shared(step), via) {
                (_, Some(pattern), _) => pattern,
                (true, None, _) if any_shared && v.is_empty() => "",
                (true, None, _) => {
                    metric_key.push('_'); // even for an empty value, as envoyproxy/ratelimit writes it
                    metric_key.push_str(v);
                    continue;
                }
                (false, None, Via::Exact) => v,
                (false, None, Via::Wildcard(_)) if node.value_to_metric => v,
                (false, None, Via::Wildcard(pattern)) => pattern,
                (false, None, Via::Any) if node.value_to_metric => v,
                (false, None, Via::Any) => "",
            };
            if !suffix.is_empty() {
                metric_key.push('_');
                metric_key.push_str(suffix);
            }
        }
        Some(Found { limit, key, metric_key })
    }
}

/// Appends `LEN:BYTES`, so that no two sequences of parts frame into the same bytes.
pub(crate) fn frame(out: &mut Vec<u8>, part: &[u8]) {
    out.extend_from_slice(part.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(part);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_envoyproxy_ratelimit() {
        let cases = [
            ("value*", "value", true),
            ("value*", "valueXYZ", true),
            ("value*", "valu", false),
            ("*", "", true),
            ("/api/*/action", "/api/123/action", true),
            ("/api/*/action", "/api//action", true),
            ("/api/*/action", "/api/123/other", false),
            ("/api/*/resource/*/action", "/api/v1/resource/9/action", true),
            ("/api/*/resource/*/action", "/api/v1/resourc/9/action", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*b*b*", "abcb", true),
            ("*b*b*", "ab", false),
            ("é*", "éa", true),
        ];
        for (pattern, value, expected) in cases {
            assert_eq!(Glob::new(pattern).unwrap().matches(value), expected, "{pattern} ~ {value}");
        }
    }

    #[test]
    fn framing_is_injective() {
        let parts = ["", "a", "1", ":", "1:", "a:", "1:a", "_", "a_b"];
        let mut seen = HashMap::new();
        for n in 0..=3 {
            let mut index = vec![0usize; n];
            loop {
                let chosen: Vec<&str> = index.iter().map(|&i| parts[i]).collect();
                let mut key = Vec::new();
                for part in &chosen {
                    frame(&mut key, part.as_bytes());
                }
                if let Some(other) = seen.insert(key, chosen.clone()) {
                    panic!("{chosen:?} and {other:?} frame alike");
                }
                let Some(pos) = index.iter().rposition(|&i| i + 1 < parts.len()) else { break };
                index[pos] += 1;
                index[pos + 1..].iter_mut().for_each(|i| *i = 0);
            }
        }
    }
}
