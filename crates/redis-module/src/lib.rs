//! tollgate's native Redis module, an optional accelerator: `TOLLGATE.CHECK`, one check of any
//! algorithm decided in Redis without a script, on the same state and with the same reply as the script's (`tollgate-store`'s `lua/`), so both
//! may serve the same keys in turn. Load it with
//! `--loadmodule libtollgate_redis_module.so` where modules are allowed, and give `tollgate
//! --store-module`: a server without it is served by the script. The crate also holds the layout
//! of a decision call ([`layout`]), which the script reads too.

pub mod layout;

pub mod algorithms;
mod command;
mod ffi;
pub mod sliding_log;
pub mod time;
