//! Arbitrary bytes as the body of `POST /v1/check`, against a server engine on the memory store:
//! never a panic, and always one of the statuses the API documents.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_server::{Config, Engine};

fn setup() -> &'static (tokio::runtime::Runtime, Engine) {
    static SETUP: OnceLock<(tokio::runtime::Runtime, Engine)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let limits = tollgate_server::config::parse_limits("[limits.api]\nlimit = \"5/1m\"\n").expect("limits");
        let engine = runtime.block_on(Engine::new(&Config { limits, ..Config::default() })).expect("engine");
        (runtime, engine)
    })
}

fuzz_target!(|data: &[u8]| {
    let (runtime, engine) = setup();
    let response = runtime.block_on(tollgate_server::http::check_json(engine, data));
    assert!(matches!(response.status().as_u16(), 200 | 400 | 429 | 503), "{}", response.status());
});
