//! A request's path in every form a backend may route it in (see the parent module): the routing
//! form, the other combinations of the structural steps, IIS's, and the `path` key they give,
//! each computed once per request, when a rule first needs it.

use std::borrow::Cow;
use std::cell::OnceCell;

use super::{Decoded, Fold, ROUTED, fold, is_routed, path};
use crate::rules::PathMatch;

/// A request's path in every form a rule may compare or key it in, each computed once, when a
/// rule first needs it.
#[derive(Debug)]
pub struct RequestPath<'a> {
    raw: &'a str,
    routed: OnceCell<Cow<'a, str>>,
    others: OnceCell<Others>,
    key: OnceCell<String>,
    exact: OnceCell<Cow<'a, str>>,
}

/// The forms of a path but its routing form, and whether they may resolve its dot segments
/// differently: a form that does not resolve them has one, and the path gives occasion for a
/// step that moves segment boundaries (`%2F`, `\`, `;`, `%u`).
#[derive(Debug, Default)]
struct Others {
    forms: Vec<String>,
    dots_ambiguous: bool,
}

impl<'a> RequestPath<'a> {
    /// The path `raw` (without the query), as the request gives it.
    #[must_use]
    pub fn new(raw: &'a str) -> Self {
        RequestPath {
            raw,
            routed: OnceCell::new(),
            others: OnceCell::new(),
            key: OnceCell::new(),
            exact: OnceCell::new(),
        }
    }

    /// The routing form ([`path`]).
    pub fn routed(&self) -> &str {
        self.routed.get_or_init(|| path(self.raw))
    }

    /// Every form a backend may route the path in, each once: the routing form first, then the
    /// path folded with each other combination of the structural steps (see the module docs).
    pub fn forms(&self) -> impl Iterator<Item = &str> {
        // The others only when the routing form did not match.
        let others = std::iter::once_with(|| self.others().forms.iter().map(String::as_str)).flatten();
        std::iter::once(self.routed()).chain(others)
    }

    /// The forms but the routing form, without repeats (none for a path already in the routing
    /// form, at most 17: 16 combinations and IIS's).
    fn others(&self) -> &Others {
        self.others.get_or_init(|| {
            if is_routed(self.raw.as_bytes()) {
                return Others::default();
            }
            // A step the path gives no occasion for changes nothing: its combinations are skipped.
            let mut occasions = [false, false, false, self.raw.contains("%u") || self.raw.contains("%U")];
            for (byte, escaped) in Decoded::new(self.raw, true) {
                occasions[0] |= byte == b'/' && escaped;
                occasions[1] |= byte == b'\\';
                occasions[2] |= byte == b';' && !escaped;
            }
            let routed = self.routed();
            let (mut others, mut dot_segments) = (Vec::new(), false);
            // Every combination of the structural steps, `%uHHHH` left as it is (only IIS decodes
            // it), and IIS's own: `%uHHHH`, `%2F` and `\` decoded, dot segments resolved.
            let combinations = (0..16u8).map(|steps| Fold {
                slash_escapes: steps & 1 != 0,
                backslashes: steps & 2 != 0,
                params: steps & 4 != 0,
                dots: steps & 8 != 0,
                percent_u: false,
                ..ROUTED
            });
            for how in combinations.chain([Fold { params: false, ..ROUTED }]) {
                let steps = [how.slash_escapes, how.backslashes, how.params, how.percent_u];
                let pointless = steps.iter().zip(occasions).any(|(&step, occasion)| step && !occasion);
                // The routing form takes every step there is an occasion for.
                if pointless || how.dots && steps == occasions {
                    continue;
                }
                let form = fold(self.raw, how);
                dot_segments |= !how.dots && form.split('/').any(|segment| segment == "." || segment == "..");
                if form != routed && !others.contains(&form) {
                    others.push(form);
                }
            }
            Others { dots_ambiguous: dot_segments && occasions.contains(&true), forms: others }
        })
    }

    /// The form of `path_match = "exact"` ([`normalize::path`](crate::normalize::path)).
    pub fn exact(&self) -> &str {
        self.exact.get_or_init(|| crate::normalize::path(self.raw))
    }

    /// The `path` key of a rule whose paths match as `mode` says: with `routed`, the routing form;
    /// or, where the forms resolve dot segments over separators they disagree on, the segments
    /// they all start with. To Kestrel `/a/b/jN%2Fk/..` is `/a/b/` whatever `jN`, while its
    /// routing form is `/a/b/jN`: a key that follows the routing form there would be a fresh
    /// budget for each `jN`. The common segments are a start of every form, the route's among
    /// them, so a route has at most one such key a segment.
    pub fn key(&self, mode: PathMatch) -> &str {
        match mode {
            PathMatch::Routed if self.others().dots_ambiguous => self.key.get_or_init(|| {
                let mut common: Vec<&str> = self.routed().split('/').collect();
                for form in &self.others().forms {
                    let agreed = common.iter().zip(form.split('/')).take_while(|(a, b)| *a == b).count();
                    common.truncate(agreed);
                }
                let key = common.join("/");
                if key.is_empty() { "/".to_owned() } else { key }
            }),
            PathMatch::Routed => self.routed(),
            PathMatch::Exact => self.exact(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_forms_are_computed_once_and_compared_only_when_they_differ() {
        let plain = RequestPath::new("/admin/login");
        assert_eq!(plain.forms().collect::<Vec<_>>(), ["/admin/login"]);
        assert_eq!(plain.exact(), "/admin/login");
        let disguised = RequestPath::new("/Public/..%2fAdmin/");
        assert_eq!(disguised.routed(), "/admin");
        // %2F a character (Express, Kestrel) or a separator left unresolved (Flask).
        assert_eq!(disguised.forms().collect::<Vec<_>>(), ["/admin", "/public/..%2Fadmin", "/public/../admin"]);
        assert_eq!(disguised.exact(), "/Public/..%2FAdmin/");
        // Its forms disagree on what `..` drops: its key is what they agree on.
        assert_eq!(disguised.key(PathMatch::Routed), "/");
        assert_eq!(RequestPath::new("/A/x/../B").key(PathMatch::Routed), "/a/b");
        assert_eq!(disguised.key(PathMatch::Exact), "/Public/..%2FAdmin/");
        assert!(matches!(path("/plain/path"), Cow::Borrowed(_)));
        // Every step a path gives occasion for, on or off: at most 18 forms, each once.
        let everything = RequestPath::new("/a/b;c\\d%2Fe/..");
        let forms: Vec<_> = everything.forms().collect();
        assert!(forms.len() <= 18 && forms.iter().enumerate().all(|(i, f)| !forms[..i].contains(f)), "{forms:?}");
        for (backend, form) in [
            ("all steps", "/a/b/d"),
            ("Express: none", "/a/b%3Bc%5Cd%2Fe/.."),
            ("Flask: %2F", "/a/b%3Bc%5Cd/e/.."),
            ("Spring 6: ;params", "/a/b/.."),
            ("Kestrel: dot segments", "/a"),
            ("nginx: %2F, dot segments", "/a/b%3Bc%5Cd"),
        ] {
            assert!(forms.contains(&form), "{backend}: {form} in {forms:?}");
        }
        // `%u002F` is an escaped slash too: Kestrel keeps it (and does not decode it).
        assert!(RequestPath::new("/a/b%u002Fc/..").forms().any(|form| form == "/a"));
    }
}
