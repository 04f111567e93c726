//! The cookie and query values tollgate keys on, against what real server libraries read from the
//! same bytes: Python's `http.cookies.SimpleCookie` (and the cookie loop of Django's
//! `parse_cookie`, on `http.cookies._unquote`) and `urllib.parse.parse_qs`. Over a corpus of
//! spellings (spaces, quotes, escapes, repeats, separators, percent-encodings, bytes that are not
//! text), wherever a library reads one value for the name, tollgate reads that value or refuses
//! the request; it never keys on another one (which would be a fresh bucket for the same client).

use std::net::IpAddr;
use std::process::Command;

use tollgate_rules::Request;

const PYTHON: &str = r#"
import json, sys
from http import cookies
from urllib.parse import parse_qs

def simple(line):
    jar = cookies.SimpleCookie()
    try:
        jar.load(line)
    except cookies.CookieError:
        return None
    return jar["session"].value if "session" in jar else None

def django(line):
    # django.http.cookie.parse_cookie, on the stdlib's unquote.
    found = {}
    for chunk in line.split(";"):
        key, val = chunk.split("=", 1) if "=" in chunk else ("", chunk)
        key, val = key.strip(), val.strip()
        if key or val:
            found[key] = cookies._unquote(val)
    return found.get("session")

out = []
for case in json.load(sys.stdin):
    line = case["cookie"]
    values = parse_qs(case["query"], keep_blank_values=True, encoding="latin-1")
    out.append({
        "simple": simple(line),
        "django": django(line),
        "query": [v.encode("latin-1").hex() for v in values.get("api_key", [])],
    })
json.dump(out, sys.stdout)
"#;

fn corpus() -> Vec<(String, String)> {
    let names = ["session", " session", "session ", "Session", "session\t"];
    let equals = ["=", " = ", "= ", " ="];
    let values = ["A", "\"A\"", " A ", "A B", "\"A;B\"", "\"A\\073\"", "\"\\\"A\"", "", "\"\"", "A\"", "A=B", "café"];
    let around = [("", ""), ("a=1; ", ""), ("", "; b=2"), ("session=B; ", ""), ("", "; session=A"), (";", ";")];
    let mut cookies = Vec::new();
    for name in names {
        for eq in equals {
            for value in values {
                for (before, after) in around {
                    cookies.push(format!("{before}{name}{eq}{value}{after}"));
                }
            }
        }
    }
    let queries = [
        "api_key=A",
        "api_key=%41",
        "api_key=A+B",
        "api_key=junk&api_key=A",
        "api_key=A&api_key=A",
        "api_key=A;x=1",
        "x=1;api_key=A",
        "api%5Fkey=A",
        "api_key",
        "api_key=",
        "api_key=%FF",
        "api_key=%zz",
        "api_key=a%26b&x=1",
        "&&api_key=A&",
    ];
    cookies.iter().enumerate().map(|(i, cookie)| (cookie.clone(), queries[i % queries.len()].to_string())).collect()
}

#[test]
fn cookie_and_query_values_are_what_python_servers_read() {
    let corpus = corpus();
    let input = serde_json::to_string(
        &corpus.iter().map(|(c, q)| serde_json::json!({"cookie": c, "query": q})).collect::<Vec<_>>(),
    )
    .unwrap();
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(python)
        .args(["-c", PYTHON])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (the test command installs it)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let read: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let mut differ = Vec::new();
    let mut agreed = 0;
    for ((cookie, query), python) in corpus.iter().zip(&read) {
        let headers = [("cookie", cookie.as_bytes())];
        let request = Request {
            method: "GET",
            path: "/",
            query,
            host: "",
            headers: &headers,
            client_ip: IpAddr::from([127, 0, 0, 1]),
            key: None,
            ja3: None,
            ja4: None,
            from_trusted_proxy: false,
        };
        // Where a library reads one value, tollgate reads it too, or refuses.
        let ours = request.cookie("session");
        for library in ["simple", "django"] {
            let Some(theirs) = python[library].as_str() else { continue };
            match &ours {
                Ok(Some(value)) if *value == theirs.as_bytes() => agreed += 1,
                Err(_) => {}
                other => differ.push(format!("cookie {cookie:?}: {library} reads {theirs:?}, tollgate {other:?}")),
            }
        }
        let theirs: Vec<Vec<u8>> =
            python["query"].as_array().unwrap().iter().map(|v| hex(v.as_str().unwrap())).collect();
        match (request.query_param("api_key"), theirs.as_slice()) {
            (Ok(Some(value)), [one, ..]) if theirs.iter().all(|v| *value == **v) && *value == **one => agreed += 1,
            (Err(_), _) | (Ok(None), []) => {}
            (ours, theirs) => differ.push(format!("query {query:?}: Python reads {theirs:?}, tollgate {ours:?}")),
        }
    }
    assert!(differ.is_empty(), "{} differences:\n{}", differ.len(), differ.join("\n"));
    assert!(agreed > corpus.len(), "the corpus exercises agreement too: {agreed}");
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}
