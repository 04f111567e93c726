//! Arbitrary text as a rules file: loading it never panics; when it loads, evaluating it on a
//! request built from the same bytes (path, query, headers, cookies) never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_rules::{Request, Rules};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(rules) = Rules::parse(&text, "fuzz") else { return };
    let path = text.lines().next().unwrap_or("/");
    let headers = [("cookie", "a=1; session=x"), ("x-api-key", path), ("x-cost", "2"), ("x-forwarded-for", path)];
    let request = Request {
        method: "POST",
        path,
        query: path,
        host: "example.com",
        headers: &headers,
        client_ip: std::net::IpAddr::from([127, 0, 0, 1]),
    };
    let _ = rules.counting(&request);
    let _ = rules.mitigating(&request);
    let _ = rules.trusted_proxies.client_ip(request.client_ip, &[path], &[path]);
});
