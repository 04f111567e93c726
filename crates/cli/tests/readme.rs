//! The transcripts of the README and of the manual's pages are run as written, and their output
//! must be what the page shows.
//!
//! Every ```` ```console ```` block of README.md and of each docs/*.md page is a transcript, run on
//! its own (a block starts whatever server it uses): `$ COMMAND` lines (continued
//! while a line ends in `|` or `\`) and `127.0.0.1:6380> COMMAND` lines (inside `redis-cli -p
//! 6380`), each followed by the output it prints. `tollgate serve` and `tollgate proxy` are
//! started in the background on free ports, their log lines compared with those shown; the ports
//! a reader would see (6380, 8080, 8081; the proxy's 8088 and 9091) stand for the ones the test
//! got. A word written `~WORD` in a page depends on the
//! clock (a timestamp, a reset in ms) and matches any word; everything else must match exactly,
//! word for word.

mod support;

use std::process::Command;

use support::{Tollgate, repo};

const PROMPT: &str = "127.0.0.1:6380> ";

/// One command of a transcript and the lines the page shows after it.
#[derive(Debug)]
struct Step {
    line: usize,
    command: String,
    in_cli: bool,
    expected: Vec<String>,
}

/// The ```console blocks of `text`, as steps (with the page's line of each command).
fn transcripts(text: &str) -> Vec<Vec<Step>> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((_, line)) = lines.next() {
        if line.trim() != "```console" {
            continue;
        }
        let mut steps: Vec<Step> = Vec::new();
        let mut continued = false;
        for (number, line) in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            if continued {
                let step = steps.last_mut().expect("a command to continue");
                step.command.push('\n');
                step.command.push_str(line);
                continued = line.ends_with('|') || line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step { line: number + 1, command: command.into(), in_cli: false, expected: Vec::new() });
                continued = line.ends_with('|') || line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix(PROMPT) {
                steps.push(Step { line: number + 1, command: command.into(), in_cli: true, expected: Vec::new() });
            } else {
                steps.last_mut().expect("output after a command").expected.push(line.to_string());
            }
        }
        blocks.push(steps);
    }
    blocks
}

/// Whether `actual` is the page's `expected` line, `~WORD`s matching any word.
fn same(expected: &str, actual: &str) -> bool {
    let (mut e, mut a) = (expected.split_whitespace(), actual.split_whitespace());
    loop {
        match (e.next(), a.next()) {
            (None, None) => return true,
            (Some(e), Some(a)) if e.starts_with('~') || e == a => {}
            _ => return false,
        }
    }
}

/// Runs a transcript's steps, asserting each one's output (`page`: where the transcript is).
fn run(page: &str, steps: &[Step]) {
    let binary = env!("CARGO_BIN_EXE_tollgate");
    let mut serve: Option<Tollgate> = None;
    let mut proxy: Option<Tollgate> = None;
    for step in steps {
        let place = format!("{page}:{}: {}", step.line, step.command);
        // The log lines a started server printed, the addresses it got shown as the page's.
        let shown_log = |started: &Tollgate, addresses: &[(String, &str)]| -> Vec<String> {
            let shown = step.expected.len();
            let log = started.wait_until(&format!("the {shown} lines of {place}"), |log| log.len() >= shown);
            log[..shown]
                .iter()
                .map(|line| addresses.iter().fold(line.clone(), |line, (actual, shown)| line.replace(actual, shown)))
                .collect()
        };
        let actual: Vec<String> = if let Some(args) = step.command.strip_prefix("tollgate serve") {
            let args: Vec<&str> = args.split_whitespace().collect();
            let started = Tollgate::serve(&args);
            let lines = shown_log(
                &started,
                &[
                    (started.resp().to_string(), "127.0.0.1:6380"),
                    (started.http().to_string(), "127.0.0.1:8080"),
                    (started.grpc().to_string(), "127.0.0.1:8081"),
                ],
            );
            serve = Some(started);
            lines
        } else if let Some(args) = step.command.strip_prefix("tollgate proxy") {
            let args: Vec<&str> = args.split_whitespace().collect();
            let started = Tollgate::proxy(&args);
            let lines = shown_log(
                &started,
                &[(started.listen().to_string(), "127.0.0.1:8088"), (started.admin().to_string(), "127.0.0.1:9091")],
            );
            proxy = Some(started);
            lines
        } else if step.command == "redis-cli -p 6380" {
            assert!(serve.is_some(), "{place}: no server started before");
            Vec::new()
        } else {
            let server = serve.as_ref();
            let output = if step.in_cli {
                let server = server.unwrap_or_else(|| panic!("{place}: no server"));
                Command::new("redis-cli")
                    .args(["--no-raw", "-p", &server.resp().port().to_string()])
                    .args(step.command.split_whitespace())
                    .output()
            } else {
                let mut command = step.command.replace("cargo run -q -p tollgate --", binary);
                if let Some(rest) = command.strip_prefix("tollgate ") {
                    command = format!("{binary} {rest}");
                }
                if let Some(server) = server {
                    command = command
                        .replace("localhost:8080", &server.http().to_string())
                        .replace("-p 6380", &format!("-p {}", server.resp().port()));
                }
                if let Some(proxy) = &proxy {
                    command = command
                        .replace("localhost:8088", &proxy.listen().to_string())
                        .replace("localhost:9091", &proxy.admin().to_string());
                }
                Command::new("bash").args(["-c", &command]).current_dir(repo()).output()
            }
            .unwrap_or_else(|e| panic!("{place}: {e}"));
            String::from_utf8_lossy(&output.stdout).lines().map(|l| l.trim_end_matches('\r').to_string()).collect()
        };
        assert_eq!(actual.len(), step.expected.len(), "{place}: got {actual:#?}, the page shows {:#?}", step.expected);
        for (expected, actual) in step.expected.iter().zip(&actual) {
            assert!(same(expected, actual), "{place}:\n  page:   {expected}\n  actual: {actual}");
        }
    }
}

/// README.md and every docs/*.md, as paths relative to the repository.
fn pages() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    [vec!["README.md".to_string()], docs].concat()
}

#[test]
fn every_transcript_of_the_readme_and_the_manual_prints_what_the_page_shows() {
    let mut count = 0;
    for page in pages() {
        let text = std::fs::read_to_string(repo().join(&page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        let blocks = transcripts(&text);
        if page == "README.md" {
            assert!(!blocks.is_empty(), "the README's console blocks: none");
        }
        for steps in &blocks {
            run(&page, steps);
        }
        count += blocks.len();
    }
    assert!(count >= 2, "console blocks in the README and docs/*.md: {count}");
}

#[test]
fn the_transcript_matcher_is_strict_except_where_marked() {
    assert!(same("5) (integer) ~1579", "5) (integer) 1552"));
    assert!(!same("5) (integer) 1579", "5) (integer) 1552"));
    assert!(!same("a b", "a b c") && !same("a b c", "a b"));
    let steps = &transcripts("```console\n$ printf 'a\\n' |\n  cat\na\n127.0.0.1:6380> PING\nPONG\n```\n")[0];
    assert_eq!(
        (steps[0].command.as_str(), steps[0].expected.as_slice()),
        ("printf 'a\\n' |\n  cat", &["a".to_string()][..])
    );
    assert!(steps[1].in_cli && steps[1].expected == ["PONG"]);
}
