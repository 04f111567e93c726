//! Why a configuration was refused: which file, where in it, and what is wrong.

use std::fmt;

/// A configuration that could not be loaded.
///
/// Displayed as `FILE[:LINE:COLUMN]: PATH: REASON`, where `PATH` is the descriptor path
/// (`messaging > message_type=marketing > to_number`: the domain, then each descriptor's
/// `key=value`, or `key` alone when it has no value). The line and column are there when the YAML
/// parser knows them (syntax and type errors); the path is empty for errors about a whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    origin: String,
    location: Option<(usize, usize)>,
    path: String,
    reason: String,
}

impl ConfigError {
    pub(crate) fn new(origin: &str, path: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError { origin: origin.to_owned(), location: None, path: path.into(), reason: reason.into() }
    }

    pub(crate) fn at(mut self, location: Option<(usize, usize)>) -> ConfigError {
        self.location = location;
        self
    }

    /// The file (or the `origin` given to [`Config::parse`](crate::Config::parse)).
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Line and column (1-based) in the file, when known.
    #[must_use]
    pub fn location(&self) -> Option<(usize, usize)> {
        self.location
    }

    /// The descriptor path, `domain > key=value > key`; empty for errors about a whole file.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong.
    #[must_use]
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// One descriptor in a path: `key=value`, or `key` when it has no value.
pub(crate) fn segment(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{}={}", shorten(key), shorten(value)),
        None => shorten(key),
    }
}

/// A key or value for a message: at most 64 characters of it.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_location_path_and_reason() {
        let e = ConfigError::new("a.yaml", "d > k=v", "bad").at(Some((3, 7)));
        assert_eq!(e.to_string(), "a.yaml:3:7: d > k=v: bad");
        assert_eq!(ConfigError::new("a.yaml", "", "empty").to_string(), "a.yaml: empty");
    }
}
