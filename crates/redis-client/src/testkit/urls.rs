//! A corpus of store URLs, well-formed and not, whose credentials must reach no message: not
//! [`redacted`](crate::redacted), not a parse error, not the `Debug` of anything built from them
//! (this crate's targets and settings, the store's configuration and store: each crate checks
//! its own with [`Leaks`]).
//!
//! Every credential in the corpus is made of the [`TOKENS`] (with `/ @ : , % #` between them),
//! and no token appears anywhere else in a URL: a token found in an output is a credential, or a
//! piece of one, that leaked.

/// The pieces every password and every user that may be a password is made of.
pub const TOKENS: [&str; 7] = ["zq9", "xw7", "kp4", "rt5", "lm6", "nb8", "yc2"];

/// What a URL of the corpus is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// It parses, with this password.
    Password(&'static str),
    /// It is refused.
    Refused,
}

use Expected::{Password, Refused};

/// The URLs, and what each is.
pub const CORPUS: &[(&str, Expected)] = &[
    // Each special character in a password, raw.
    ("redis://:zq9/xw7@127.0.0.1:6379/0", Password("zq9/xw7")),
    ("redis://tg:zq9@xw7@h:1", Password("zq9@xw7")),
    ("redis://tg:zq9:xw7@h:1", Password("zq9:xw7")),
    ("redis://:zq9,xw7@h:1", Password("zq9,xw7")),
    ("redis://:zq9%xw7@h:1", Password("zq9%xw7")),
    ("redis://:zq9#xw7@h:1", Password("zq9#xw7")),
    ("redis://:zq9?xw7@h:1", Password("zq9?xw7")),
    ("redis://:zq9://xw7@h:1", Password("zq9://xw7")),
    ("redis://:zq9]xw7@[::1]:6379", Password("zq9]xw7")),
    // All of them at once, and percent-encoded.
    ("redis://:zq9/xw7@kp4:rt5,lm6%nb8#yc2@h:1/2", Password("zq9/xw7@kp4:rt5,lm6%nb8#yc2")),
    ("redis://:zq9%2Fxw7%40kp4%3Art5%2Clm6%25nb8%23yc2@h:1", Password("zq9/xw7@kp4:rt5,lm6%nb8#yc2")),
    ("redis://:zq9xw7@h", Password("zq9xw7")),
    // Every topology, plain and TLS.
    ("redis+cluster://tg:zq9/xw7,kp4@a:7000,b:7001,c:7002", Password("zq9/xw7,kp4")),
    ("rediss+cluster://:zq9/xw7@a:1,b:2", Password("zq9/xw7")),
    ("redis+sentinel://tg:zq9/xw7@s1:26379,s2/mymaster/3", Password("zq9/xw7")),
    ("rediss+sentinel://:zq9,xw7@s1,s2/m", Password("zq9,xw7")),
    ("rediss://tg:zq9@xw7@h:6380", Password("zq9@xw7")),
    // A user without a password: Redis would ignore the user, and it may well be a password
    // written where the user goes.
    ("redis://zq9xw7@h:1", Refused),
    ("redis://zq9/xw7:@h:1", Refused),
    // Malformed ports.
    ("redis://:zq9xw7@127.0.0.1:notaport/0", Refused),
    ("redis://:zq9/xw7@h:notaport", Refused),
    ("redis://:zq9/xw7@h:99999", Refused),
    ("redis+cluster://:zq9,xw7@a:1,b:notaport", Refused),
    // Missing hosts.
    ("redis://:zq9xw7@", Refused),
    ("redis://:zq9/xw7@/0", Refused),
    ("redis://:zq9xw7@:6379", Refused),
    ("redis+cluster://:zq9,xw7@", Refused),
    ("redis+sentinel://:zq9/xw7@/m", Refused),
    ("redis://:zq9xw7@[::1", Refused),
    // A password without the '@' and host that should follow it.
    ("redis://:zq9xw7", Refused),
    ("redis://:zq9/xw7", Refused),
    ("redis://tg:zq9xw7/0", Refused),
    ("redis://tg:zq9,xw7", Refused),
    // ... and the host forgotten with the port kept: what stands before the port is no host (an
    // IPv6 address goes in brackets), not a host named after the password.
    ("redis://:zq9xw7:6379", Refused),
    ("redis://tg:zq9xw7:6379/0", Refused),
    ("redis+cluster://tg:zq9xw7:7000,h:7001", Refused),
    ("redis+sentinel://:zq9xw7:26379/mymaster", Refused),
    // Garbage after the password, or after the host.
    ("redis://:zq9xw7@h:1 x", Refused),
    ("redis://:zq9/xw7@h:1/notadb", Refused),
    ("redis://:zq9xw7@h:1/0?protocol=resp3", Refused),
    ("redis://:zq9xw7@h:1/#insecure", Refused),
    ("redis://:zq9,xw7@a:1,b:2", Refused),
    ("redis+cluster://:zq9xw7@a:1/3", Refused),
    ("redis+sentinel://:zq9/xw7@s1", Refused),
    ("redis://:zq9%FFxw7@h", Refused),
    // No scheme, or a wrong one.
    (":zq9xw7@h:1", Refused),
    ("tg:zq9xw7@h", Refused),
    ("redis:/:zq9xw7@h", Refused),
    ("redis//:zq9/xw7@h", Refused),
    ("zq9://xw7@h", Refused),
    ("http://tg:zq9xw7@h", Refused),
    ("mongodb://:zq9/xw7@h", Refused),
];

/// What leaked, one line per output that holds a token.
#[derive(Debug, Default)]
pub struct Leaks(Vec<String>);

impl Leaks {
    /// Notes `text` (`what`, of `url`) if it holds a token.
    pub fn check(&mut self, url: &str, what: &str, text: &str) {
        if let Some(token) = TOKENS.iter().find(|t| text.contains(**t)) {
            self.0.push(format!("{url}: {what} holds {token:?}: {text}"));
        }
    }

    /// Notes a URL misread (parsed when it should be refused, or the other way round).
    pub fn misread(&mut self, url: &str, what: String) {
        self.0.push(format!("{url}: {what}"));
    }

    /// Panics with every leak (and every URL misread) found, if any.
    pub fn none(self) {
        assert!(self.0.is_empty(), "{} leaks:\n{}", self.0.len(), self.0.join("\n"));
    }
}
