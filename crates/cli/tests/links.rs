//! The README's and the manual's relative links lead somewhere: every `[text](path)` and
//! `[text](path#anchor)` of README.md and of each docs/*.md names a file or directory of the
//! repository, and its `#anchor` a heading of the page it names (GitHub's slugs: lower case,
//! spaces to `-`, punctuation other than `-` and `_` dropped, backticks with it; a repeated
//! heading gets `-1`, `-2`, ...). Links inside code (fenced blocks, code spans) are not links;
//! `http(s)://` and `mailto:` links are not checked (no network).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every docs/*.md, as paths relative to the repository.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| Path::new("docs").join(path.file_name().expect("a file name")))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// Whether `line` opens or closes a fenced code block (up to three spaces of indentation).
fn fence(line: &str) -> Option<&'static str> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    if trimmed.starts_with("```") {
        Some("```")
    } else if trimmed.starts_with("~~~") {
        Some("~~~")
    } else {
        None
    }
}

/// The lines of `text` outside fenced code blocks, with their line numbers (from 1); the lines
/// inside a block are returned empty, so that code spans never run across a block.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut open: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some(kind)) => {
                open = Some(kind);
                lines.push((index + 1, String::new()));
            }
            (Some(kind), Some(this)) if kind == this && line.trim().trim_start_matches(kind).is_empty() => {
                open = None;
                lines.push((index + 1, String::new()));
            }
            (Some(_), _) => lines.push((index + 1, String::new())),
            (None, None) => lines.push((index + 1, line.to_string())),
        }
    }
    lines
}

/// `text` with its code spans (a run of backticks up to the next run of the same length) blanked
/// out, character for character, so that positions (and line breaks) stay where they were.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let run = |at: usize| chars[at..].iter().take_while(|&&c| c == '`').count();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let length = run(i);
        let mut j = i + length;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = run(j);
                if other == length {
                    close = Some(j);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + length] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + length;
            }
            None => i += length,
        }
    }
    out.into_iter().collect()
}

/// The inline links of a page's text, as (line, target), outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let lines = prose(text);
    let joined = lines.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n");
    let plain: Vec<char> = without_code_spans(&joined).chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 1 < plain.len() {
        if plain[i] == ']' && plain[i + 1] == '(' {
            let start = i + 2;
            let mut depth = 0usize;
            let mut end = start;
            while end < plain.len() {
                match plain[end] {
                    '(' => depth += 1,
                    ')' if depth == 0 => break,
                    ')' => depth -= 1,
                    '\n' => break,
                    _ => {}
                }
                end += 1;
            }
            if end < plain.len() && plain[end] == ')' {
                let inside: String = plain[start..end].iter().collect();
                let target = inside.split_whitespace().next().unwrap_or_default();
                let target = target.trim_start_matches('<').trim_end_matches('>').to_string();
                let line = plain[..i].iter().filter(|&&c| c == '\n').count() + 1;
                found.push((line, target));
                i = end;
            }
        }
        i += 1;
    }
    found
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    // A link in a heading reads as its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else { break };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else { break };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (ATX headings outside code blocks), repeated ones numbered.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose(text) {
        let trimmed = line.trim_start_matches(' ');
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if level == 0 || level > 6 {
            continue;
        }
        let rest = &trimmed[level..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        // A closing sequence of #s (after a space) is not part of the heading.
        let rest = rest.trim();
        let rest = match rest.trim_end_matches('#') {
            stripped if stripped.is_empty() || stripped.ends_with(' ') => stripped.trim_end(),
            _ => rest,
        };
        let base = slug(rest);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// What is wrong with each relative link of `page` (a path relative to `root`), as
/// `page:line: target: problem`.
fn broken(root: &Path, page: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (line, target) in links(text) {
        let lower = target.to_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:") {
            continue;
        }
        let place = format!("{}:{line}: {target}", page.display());
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        if path.contains("://") {
            problems.push(format!("{place}: a scheme other than http(s) or mailto"));
            continue;
        }
        let file = if path.is_empty() {
            root.join(page.parent().unwrap_or(Path::new("")))
        } else if let Some(absolute) = path.strip_prefix('/') {
            root.join(absolute)
        } else {
            root.join(page.parent().unwrap_or(Path::new(""))).join(path)
        };
        if !file.exists() {
            problems.push(format!("{place}: no such file or directory"));
            continue;
        }
        // Inside the repository: no `..` climbing out of it.
        let inside = match (file.canonicalize(), root.canonicalize()) {
            (Ok(file), Ok(root)) => file.starts_with(root),
            _ => false,
        };
        if !inside {
            problems.push(format!("{place}: outside the repository"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if path.is_empty() {
            if !anchors(text).contains(anchor) {
                problems.push(format!("{place}: no heading of this page with the anchor #{anchor}"));
            }
            continue;
        }
        if !file.is_file() || file.extension().is_none_or(|e| e != "md") {
            problems.push(format!("{place}: an anchor into something that is not a Markdown page"));
            continue;
        }
        let target_text = std::fs::read_to_string(&file).unwrap_or_default();
        if !anchors(&target_text).contains(anchor) {
            problems.push(format!("{place}: no heading with the anchor #{anchor}"));
        }
    }
    problems
}

#[test]
fn every_relative_link_of_the_readme_and_the_manual_resolves() {
    let root = repo();
    let pages = pages();
    assert!(pages.len() >= 2, "README.md and docs/*.md: {pages:?}");
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(root.join(page)).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        checked += links(&text).len();
        problems.extend(broken(&root, page, &text));
    }
    assert!(problems.is_empty(), "{} broken links:\n{}", problems.len(), problems.join("\n"));
    assert!(checked > 0, "no links found in {pages:?}");
}

#[test]
fn the_checker_finds_broken_links_and_only_those() {
    assert_eq!(
        slug("Redis: a server, a Cluster or Sentinel (feature `redis`)"),
        "redis-a-server-a-cluster-or-sentinel-feature-redis"
    );
    assert_eq!(slug("`tollgate serve`"), "tollgate-serve");
    assert_eq!(slug("Envoy's rate-limit service (gRPC)"), "envoys-rate-limit-service-grpc");
    assert_eq!(slug("Hot keys: leases"), "hot-keys-leases");
    assert_eq!(slug("snake_case and [a link](x.md)"), "snake_case-and-a-link");
    let anchors = anchors("# A\n\n```sh\n# not a heading\n```\n## A\n### B ##\n#nope\n");
    assert_eq!(anchors, HashSet::from(["a".to_string(), "a-1".to_string(), "b".to_string()]));

    let root = repo();
    let page = Path::new("docs/example.md");
    let text = "# Top\n\n\
        [ok](../README.md), [ok](#top), [ok](SEMANTICS.md#stores), [ok](../crates/cli),\n\
        [ok](https://example.com/nowhere), `[code](nowhere.md)` and\n\
        ```text\n[block](nowhere.md)\n```\n\
        [missing](nowhere.md), [bad anchor](SEMANTICS.md#nowhere), [here](#nowhere),\n\
        [outside](../../somewhere), [a `span`\nacross lines](gone.md#x)\n";
    let problems = broken(&root, page, text);
    let targets: Vec<&str> = problems.iter().map(|p| p.split(": ").next().unwrap_or_default()).collect();
    assert_eq!(
        targets,
        ["docs/example.md:8", "docs/example.md:8", "docs/example.md:8", "docs/example.md:9", "docs/example.md:10"],
        "{problems:#?}"
    );
    assert!(problems[0].ends_with("nowhere.md: no such file or directory"), "{problems:#?}");
    assert!(problems[1].ends_with("no heading with the anchor #nowhere"), "{problems:#?}");
    assert!(problems[2].ends_with("no heading of this page with the anchor #nowhere"), "{problems:#?}");
    assert!(problems[4].contains("gone.md#x"), "{problems:#?}");
}
