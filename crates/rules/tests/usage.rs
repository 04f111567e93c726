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
    assert_eq!(r.cost, Cost::Response { from: ResponseCost::Usage("total_tokens".into()), estimate: 500 });
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
    ];
    for (fields, wanted) in cases {
        let error = rule(fields).unwrap_err();
        assert!(error.contains("rule \"tokens\"") && error.contains(wanted), "{fields}: {error}");
    }
}
