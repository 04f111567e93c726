//! The routing form of a path (`tollgate_rules::route`) on arbitrary input: it never panics, it is
//! a fixed point, it has the shape it promises, its work is bounded, and a rule written as any
//! spelling matches that spelling (as a path, a prefix and a glob).

use std::net::IpAddr;

use proptest::prelude::*;
use tollgate_rules::route::{self, Pattern, RequestPath};
use tollgate_rules::{Glob, Match, PathMatch, Request, Rules};

/// Bytes as a path: mostly the bytes the folding treats specially, some arbitrary (as text, the
/// way a path reaches the rules; bytes that are not UTF-8 become U+FFFD).
fn path() -> impl Strategy<Value = String> {
    let special = prop::sample::select(b"/\\%;.?#*2fFcC5eEaAu0".to_vec());
    prop::collection::vec(prop_oneof![3 => special, 1 => any::<u8>()], 0..48)
        .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

fn request(path: &str) -> Request<'_> {
    Request {
        method: "GET",
        path,
        query: "",
        host: "example.com",
        headers: &[],
        client_ip: IpAddr::from([192, 0, 2, 1]),
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn the_routing_form_is_a_fixed_point_of_the_promised_shape(raw in path()) {
        let routed = route::path(&raw);
        prop_assert_eq!(route::path(&routed), routed.clone(), "folded twice");
        prop_assert!(routed.is_ascii() && routed.starts_with('/'), "{routed:?}");
        prop_assert!(routed == "/" || !routed.ends_with('/'), "a trailing slash in {routed:?}");
        prop_assert!(!routed.contains("//") && !routed.contains(['\\', ';']), "{routed:?}");
        prop_assert!(well_spelled(&routed), "{routed:?}");
        prop_assert!(routed.split('/').all(|segment| segment != "." && segment != ".."), "{routed:?}");
        prop_assert!(routed.len() <= 3 * raw.len() + 1, "{} bytes from {}", routed.len(), raw.len());
        let literal = route::literal(&raw);
        prop_assert_eq!(route::literal(&literal), literal.clone(), "literal folded twice");
        prop_assert!(literal.is_ascii() && literal.starts_with('/') && !literal.contains("//"), "{literal:?}");
        prop_assert_eq!(route::pattern(&raw, Pattern::Path), routed.as_ref());
        // Every form a backend may route it in: the routing form first, each once, at most 18.
        let request = RequestPath::new(&raw);
        let forms: Vec<&str> = request.forms().collect();
        prop_assert!(forms[0] == routed.as_ref() && forms.len() <= 18, "{forms:?}");
        for (i, form) in forms.iter().enumerate() {
            prop_assert!(!forms[..i].contains(form), "{form:?} twice");
            prop_assert!(form.is_ascii() && form.starts_with('/') && !form.contains("//"), "{form:?}");
            prop_assert!(form.len() <= 3 * raw.len() + 1 && well_spelled(form), "{form:?}");
        }
        // The key is the routing form, or segments every form starts with.
        let key = request.key(PathMatch::Routed);
        let starts = |form: &str| key == "/" || form == key || form.starts_with(&format!("{key}/"));
        prop_assert!(key == forms[0] || forms.iter().all(|form| starts(form)), "{key:?} of {forms:?}");
    }

    /// A rule written as a spelling matches that spelling, whichever way it is written: what the
    /// pattern folds to is what the request folds to.
    #[test]
    fn a_rule_matches_the_spelling_it_is_written_as(raw in path()) {
        let raw = format!("/{raw}");
        let path = RequestPath::new(&raw);
        let request = request(&raw);
        let glob = Glob::try_from(raw.clone()).unwrap();
        for (what, written) in [
            ("path", Match { path: Some(raw.clone()), ..Match::default() }),
            ("path_prefix", Match { path_prefix: Some(raw.clone()), ..Match::default() }),
            ("path_glob", Match { path_glob: Some(glob.clone()), ..Match::default() }),
        ] {
            prop_assert!(written.routed().unwrap().matches(&request, &path, PathMatch::Routed), "{what} {raw:?}");
        }
    }
}

/// Whether `text` is printable ASCII whose only uppercase letters are the hex digits of escapes,
/// each `%` starting one.
fn well_spelled(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let upper_hex = |b: &u8| b.is_ascii_digit() || (b'A'..=b'F').contains(b);
                if !bytes.get(i + 1..i + 3).is_some_and(|pair| pair.iter().all(upper_hex)) {
                    return false;
                }
                i += 3;
            }
            byte if byte.is_ascii_uppercase() || !byte.is_ascii_graphic() => return false,
            _ => i += 1,
        }
    }
    true
}

/// The longest paths (64 KiB: the longest target the `http` crate accepts) of `..`, escapes,
/// parameters, backslashes and slashes fold without a panic, within bounds, to fixed points.
#[test]
fn the_longest_paths_fold() {
    for unit in ["/..", "/a%2F..", "/a;b=c", "/%41%2f", "/x\\..\\", "//", "/a;b\\c%2F../é", "/%u002e;\\%2F../"] {
        let raw = unit.repeat((64 << 10) / unit.len());
        let routed = route::path(&raw);
        assert!(routed.len() <= 3 * raw.len() + 1);
        assert_eq!(route::path(&routed), routed, "{unit}");
        assert!(RequestPath::new(&raw).forms().count() <= 18, "{unit}");
    }
}

/// The names of the rules of `rules` that count `path` (GET).
fn counting<'r>(rules: &'r Rules, path: &str) -> Vec<&'r str> {
    let counted = rules.counting(&request(path)).unwrap();
    counted.iter().map(|applied| rules.rules[applied.rule].name.as_str()).collect()
}

/// Backends take some of the structural steps, not all or none: ASP.NET Core (Kestrel, and IIS
/// in-process) resolves dot segments but keeps `%2F`, `\` and `;` as characters; nginx decodes
/// `%2F` and resolves dot segments but keeps `\` and `;`; Flask and Django behind gunicorn decode
/// `%2F` but resolve nothing; Spring 6 strips `;params` from the raw path and resolves nothing.
/// Before: each spelling below reached its route uncounted, as neither the routing form (every
/// step) nor the literal form (none) is what that backend routes.
#[test]
fn a_backend_taking_some_structural_steps_is_counted_too() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"login\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = { path = \"/admin/login\" }\n\
         [[rules]]\nname = \"public\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = { path_prefix = \"/public/\" }\n\
         [[rules]]\nname = \"files\"\nlimit = \"5/1m\"\nkey = [\"global\"]\nmatch = { path_glob = \"/files/*\" }\n",
        "t",
    )
    .unwrap();
    let mut escaped = Vec::new();
    for (backend, path, rule) in [
        ("Kestrel: /admin/login/", "/admin/login/x%2Fy/..", "login"),
        ("Kestrel, nginx: /admin/login/", "/admin/login/x\\y/..", "login"),
        ("Kestrel, nginx, IIS: /admin/login/", "/admin/login/..;/..", "login"),
        ("Kestrel: /admin/login/", "/admin/login/x%5Cy/..", "login"),
        ("nginx: /admin/login/", "/admin/login/x\\y%2F..", "login"),
        ("Tomcat, allowBackslash: /admin/login", "/admin/login;x\\y", "login"),
        ("Flask: /public/../admin", "/public%2F..%2Fadmin", "public"),
        ("Spring 6: /public/..", "/public;x/..", "public"),
        ("Kestrel: /files/x/", "/files/x/y%2Fz/..", "files"),
        ("Flask: /files/..", "/files%2F..", "files"),
    ] {
        if !counting(&rules, path).contains(&rule) {
            escaped.push(format!("{path} ({backend}) escaped {rule}"));
        }
    }
    assert!(escaped.is_empty(), "{}", escaped.join("\n"));
    // A path whose spellings all agree is compared once.
    // A path whose spellings all agree is compared once.
    assert_eq!(RequestPath::new("/Admin/Login").forms().count(), 1);
}

/// A `path` key cannot be varied at will for one route: to Kestrel `/keyed/report/jN%2Fk/..` is
/// `/keyed/report/` whatever `jN`, but its routing form is `/keyed/report/jN`. Where forms resolve
/// dot segments differently, the key is what every form agrees on (their common segments), which
/// the route's own form starts with: at most one key a segment of the route. Before: every `jN`
/// was a fresh budget.
#[test]
fn a_path_key_cannot_be_varied_by_a_dot_segment_over_another_separator() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"keyed\"\nlimit = \"5/1m\"\nkey = [\"path\"]\nmatch = { path_prefix = \"/keyed/\" }\n",
        "t",
    )
    .unwrap();
    let key = |path: &str| String::from_utf8(rules.counting(&request(path)).unwrap()[0].key.clone()).unwrap();
    let mut keys: Vec<String> = (0..20)
        .flat_map(|n| {
            [
                format!("/keyed/report/j{n}%2Fk/.."),
                format!("/keyed/report/j{n}\\k/.."),
                format!("/keyed/report/j{n}%u002Fk/.."),
            ]
        })
        .map(|path| key(&path))
        .collect();
    keys.sort();
    keys.dedup();
    assert!(keys.len() <= 3, "{} keys for /keyed/report: {keys:?}", keys.len());
    // Spellings whose forms agree on the dot segments keep their routing form.
    assert_eq!(key("/keyed/x/../report"), "/keyed/report");
    assert_eq!(key("/Keyed%2Freport;v=1"), "/keyed/report");
}
