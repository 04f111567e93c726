//! # tollgate-rules
//!
//! Which requests count, under which key and limit, and what happens once a key is over: the
//! rules file shared by the middleware, the server and the proxy. Pure: no I/O besides reading
//! the file, no clock, no store.
//!
//! - [`Rules::counting`]: the rules that count a request, with its key (rule name + the values
//!   of the characteristics: client IP, headers, cookies, query parameters, path, method) and cost;
//! - [`Rules::mitigating`]: the rules whose mitigation match covers it (possibly broader);
//! - [`TrustedProxies::client_ip`]: the client address, never the spoofable leftmost
//!   `X-Forwarded-For` entry.

mod ip;
mod matcher;
mod request;
mod rules;

pub use ip::{Cidr, TrustedProxies};
pub use matcher::{HeaderEquals, Match};
pub use request::Request;
pub use rules::{Action, Applied, Characteristic, Cost, RequestError, Rule, Rules, RulesError};
