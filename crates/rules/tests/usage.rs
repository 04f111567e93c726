//! Rules whose cost is read from the response: loaded with their estimate, bad ones refused at
//! load with a precise error.

use tollgate_rules::{Cost, ResponseCost, Rules};

fn rule(fields: &str) -> Result<Rules, String> {
    let text =
        format!("[[rules]]\nname = \"tokens\"\nlimit = \"100000/1m\"\nkey = [\"header:authorization\"]\n{fields}");
    Rules::parse(&text, "rules.toml").map_err(|e| e.to_string())
}

#[test]
fn a_usage_field_or_header_cost_loads_with_its_estimate() {
    let rules = rule("cost = \"response.usage.total_tokens\"\nestimate = 500").unwrap();
    let r = &rules.rules[0];
    assert_eq!(
        r.cost,
        Cost::Response { from: ResponseCost::Usage("total_tokens".into()), estimate: 500, estimate_from: None }
    );
    assert!(r.settles_after() && r.count_status.is_none());
    let rules = rule("cost = \"response.header.X-Tokens\"\nestimate = 1").unwrap();
    assert_eq!(rules.rules[0].response_cost(), Some(&ResponseCost::Header("x-tokens".into())));
    let fixed = rule("cost = 3").unwrap();
    assert_eq!((fixed.rules[0].cost.clone(), fixed.rules[0].settles_after()), (Cost::Fixed(3), false));
}

#[test]
fn bad_response_costs_are_refused_at_load() {
    let cases = [
        ("cost = \"response.usage.total_tokens\"", "needs an estimate = N"),
        ("cost = \"response.usage.total_tokens\"\nestimate = 0", "estimate 0: use 1 to the limit's capacity 100000"),
        ("cost = \"response.usage.total_tokens\"\nestimate = 100001", "estimate 100001"),
        ("cost = \"response.usage.usage.total\"\nestimate = 1", "no nested path"),
        ("cost = \"response.json.tokens\"\nestimate = 1", "use a number, \"response.usage.FIELD\""),
        ("cost = \"tokens\"\nestimate = 1", "use a number, \"response.usage.FIELD\""),
        ("cost = \"response.header.\"\nestimate = 1", "a header name"),
        ("cost = 2\nestimate = 1", "estimate applies with a cost read from the response only"),
        ("cost = \"response.usage.total_tokens\"\nestimate = 1\ncost_header = \"x-cost\"", "do not combine"),
        ("cost = \"response.usage.total_tokens\"\nestimate = 1\ncount_status = [200]", "count_status and cost"),
        ("cost = 0", "cost 0: use 1 to the limit's capacity"),
        ("cost = 1.5", "a positive integer, or a string such as"),
        ("cost = -1", "a positive integer, or a string such as"),
        ("cost = \"response.usage.total_tokens\"\nestimate = true", "a positive integer, or a string such as"),
    ];
    for (fields, wanted) in cases {
        let error = rule(fields).unwrap_err();
        assert!(error.contains(wanted), "{fields}: {error}");
    }
    let error = rule("cost = \"response.usage.total_tokens\"").unwrap_err();
    assert!(error.starts_with("rules.toml: rule \"tokens\": "), "names the file and the rule: {error}");
}

/// Headers as a front end passes them, the request field's value among them.
fn estimate_for(rules: &Rules, headers: &[(&str, &[u8])]) -> u64 {
    let request = tollgate_rules::Request {
        method: "POST",
        path: "/v1/messages",
        query: "",
        host: "",
        headers,
        client_ip: "192.0.2.1".parse().unwrap(),
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    };
    rules.rules[0].cost_for(&request).unwrap()
}

#[test]
fn an_estimate_read_from_the_request_falls_back_to_its_default_and_stops_at_the_capacity() {
    let rules = rule(
        "cost = \"response.usage.output_tokens\"\nestimate = \"request.json.max_tokens\"\nestimate_default = 4096",
    )
    .unwrap();
    assert_eq!(rules.request_fields().len(), 1);
    let field = rules.request_fields()[0].pseudo_header().to_string();
    assert_eq!(field, ":request.json.max_tokens");
    assert_eq!(estimate_for(&rules, &[(&field, b"1024")]), 1024);
    assert_eq!(estimate_for(&rules, &[]), 4096, "not given: the default");
    assert_eq!(estimate_for(&rules, &[(&field, b"0")]), 4096, "0 reserves nothing: the default");
    assert_eq!(estimate_for(&rules, &[(&field, b"5000000")]), 100_000, "at most the capacity");
    assert!(rules.header_names().iter().all(|n| !n.starts_with(':')), "not a header to copy");
    for (fields, wanted) in [
        ("estimate = \"request.json.max_tokens\"", "needs an estimate_default = N"),
        ("estimate = \"request.body.max_tokens\"", "use a number or \"request.json.FIELD\""),
        ("estimate = \"request.json.a..b\"", "dot-separated"),
        ("estimate = 5\nestimate_default = 5", "estimate_default applies with an estimate read from the request only"),
        ("estimate = \"max_tokens\"\nestimate_default = 5", "use a number or \"request.json.FIELD\""),
    ] {
        let error = rule(&format!("cost = \"response.usage.output_tokens\"\n{fields}")).unwrap_err();
        assert!(error.contains(wanted), "{fields}: {error}");
    }
}

/// `examples/rules/llm-tokens.toml`, as docs/rules.md shows it: input and output tokens per API
/// key, each from its own field, the output's estimate read from the request's `max_tokens`.
#[test]
fn the_llm_tokens_example_loads_and_is_the_one_the_manual_shows() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("examples/rules/llm-tokens.toml")).unwrap();
    let rules = Rules::parse(&text, "llm-tokens.toml").unwrap();
    let costs: Vec<_> = rules.rules.iter().map(|r| (r.name.as_str(), r.response_cost().unwrap().to_string())).collect();
    assert_eq!(
        costs,
        [
            ("input-tokens", "response.usage.prompt_tokens".to_string()),
            ("output-tokens", "response.usage.completion_tokens".to_string())
        ]
    );
    assert_eq!(rules.request_fields()[0].pseudo_header(), ":request.json.max_tokens");
    // The manual shows the file without its comments.
    let manual = std::fs::read_to_string(root.join("docs/rules.md")).unwrap();
    let rules_only: String = text.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    assert!(manual.contains(rules_only.trim()), "docs/rules.md shows examples/rules/llm-tokens.toml");
}
