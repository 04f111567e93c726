//! A Lua program as a server runs it, whatever the server allows: a Redis Functions library
//! called by `FCALL` (loaded where it is missing), the same source by `EVALSHA` on a server
//! without functions or whose ACL user may not use them (loaded after `NOSCRIPT`), and optionally
//! a [`Native`] command (a Redis module's) that decides the same calls where it is loaded. Which
//! form a server gets is decided per server, by its answers (see `node.rs`); what the program
//! says is its owner's (the store's decision script).

/// A server-side command that answers the same calls as a script's function, natively (a Redis
/// module's): its calls go to the script on a server that lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Native {
    /// The command's name (`TOLLGATE.CHECK`): a call whose first word it is, is native.
    pub command: &'static str,
    /// Words of the command's errors that mean "not this call, use the script" (another build's
    /// layout, an algorithm it does not decide), besides an unknown command or one the ACL user
    /// may not call.
    pub refusals: &'static [&'static str],
}

/// A Lua program in both forms (see the module docs).
#[derive(Debug, Clone)]
pub struct Script {
    /// The library `FUNCTION LOAD` takes.
    library: String,
    /// The function it registers, which `FCALL` calls.
    function: String,
    /// The source `EVALSHA` runs, and its SHA1.
    eval: String,
    sha1: String,
    /// The native command answering the same calls, if any.
    native: Option<Native>,
}

impl Script {
    /// The program whose library `library` (with its `#!lua name=…` line) registers `function`,
    /// and whose `EVAL` form is `eval` (the same body, returning the function's answer).
    #[must_use]
    pub fn new(library: String, function: String, eval: String) -> Self {
        let sha1 = redis::Script::new(&eval).get_hash().to_string();
        Script { library, function, eval, sha1, native: None }
    }

    /// The same program, with `native` deciding its calls where the server has it.
    #[must_use]
    pub fn with_native(mut self, native: Native) -> Self {
        self.native = Some(native);
        self
    }

    /// The library `FUNCTION LOAD` takes.
    #[must_use]
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The function the library registers.
    #[must_use]
    pub fn function(&self) -> &str {
        &self.function
    }

    /// The source `EVAL` and `EVALSHA` run.
    #[must_use]
    pub fn eval(&self) -> &str {
        &self.eval
    }

    /// The SHA1 of [`eval`](Self::eval).
    #[must_use]
    pub fn sha1(&self) -> &str {
        &self.sha1
    }

    /// The native command, if any.
    pub(crate) fn native(&self) -> Option<&Native> {
        self.native.as_ref()
    }

    /// Whether `cmd` is a call of the native command.
    pub(crate) fn is_native_call(&self, cmd: &redis::Cmd) -> bool {
        let Some(native) = &self.native else { return false };
        matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(name)) if name == native.command.as_bytes())
    }

    /// The native call `check` (`COMMAND key args...`) as the script's `FCALL`.
    pub(crate) fn fcall_of(&self, check: &redis::Cmd) -> redis::Cmd {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(&self.function).arg(1);
        for arg in check.args_iter().skip(1) {
            if let redis::Arg::Simple(bytes) = arg {
                fcall.arg(bytes);
            }
        }
        fcall
    }

    /// The call `fcall` (`FCALL function numkeys keys... args...`) as `EVALSHA`.
    pub(crate) fn evalsha(&self, fcall: &redis::Cmd) -> redis::Cmd {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg(&self.sha1);
        for arg in fcall.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NATIVE: Native = Native { command: "LIB.CHECK", refusals: &["LIB_VERSION"] };

    fn args(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => b"<not simple>".to_vec(),
            })
            .collect()
    }

    #[test]
    fn a_native_call_becomes_the_fcall_and_the_fcall_the_evalsha() {
        let script = Script::new("#!lua name=lib\n…".into(), "lib_f".into(), "return 1".into()).with_native(NATIVE);
        assert_eq!(script.sha1(), redis::Script::new("return 1").get_hash());
        let native = redis::cmd("LIB.CHECK").arg("k").arg("a1").arg(2).clone();
        assert!(script.is_native_call(&native));
        assert!(!script.is_native_call(&redis::cmd("FCALL")));
        let fcall = script.fcall_of(&native);
        assert_eq!(args(&fcall), [&b"FCALL"[..], b"lib_f", b"1", b"k", b"a1", b"2"]);
        let eval = script.evalsha(&fcall);
        assert_eq!(
            args(&eval),
            [
                b"EVALSHA".to_vec(),
                script.sha1().as_bytes().to_vec(),
                b"1".into(),
                b"k".into(),
                b"a1".into(),
                b"2".into()
            ]
        );
        let plain = Script::new(String::new(), "f".into(), String::new());
        assert!(!plain.is_native_call(&native), "a script without a native command has no native calls");
    }
}
