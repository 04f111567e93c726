//! tollgate's native Redis module, an optional accelerator: `TOLLGATE.CHECK`, one check decided
//! in Redis without a script, on the same state and with the same reply as the script's
//! (`tollgate-store`'s `lua/`), so both may serve the same keys in turn. It runs tollgate-core's
//! own algorithm steps ([`stored`] reads and writes the script's stored format around them), for
//! every algorithm but the sliding log, whose Redis list only the script reads. Load it with
//! `--loadmodule libtollgate_redis_module.so` where modules are allowed, and give `tollgate
//! --store-module`: a server without it is served by the script. The layout of the call is
//! `tollgate_store::layout`'s, which the script reads too.

mod command;
mod ffi;
pub mod stored;
