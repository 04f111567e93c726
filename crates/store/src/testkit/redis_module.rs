//! tollgate's native Redis module (`tollgate-redis-module`) for tests: the path of its library,
//! built for the profile the running test was built in, so that a crate's tests pass on their own
//! (`cargo test -p tollgate-store`, with or without `--release`) whatever was built before.
//!
//! This crate does not depend on the module (the module depends on this crate's layout), so
//! nothing builds the library with the tests: the first test that asks for it runs `cargo build
//! -p tollgate-redis-module` once per test process, with the same profile and target directory
//! (cargo's own lock orders concurrent builds), and takes the path cargo reports.
//! `TOLLGATE_REDIS_MODULE` names a library to use instead (a machine without cargo).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The environment variable naming a module library to use instead of building one.
pub const MODULE_ENV: &str = "TOLLGATE_REDIS_MODULE";

/// The path of the module's library (for a `loadmodule …` line): `TOLLGATE_REDIS_MODULE` if set,
/// else the one cargo builds for this test's profile (built now if missing or stale). Panics with
/// cargo's own message if it cannot be built.
#[must_use]
pub fn module_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var_os(MODULE_ENV) {
        Some(path) => PathBuf::from(path),
        None => build(),
    })
    .clone()
}

/// Where the running test binary was built: its target directory and the cargo profile (the test
/// binary is `<target>/<profile dir>/deps/<name>`, and the dev profile's directory is `debug`).
fn built_in() -> (PathBuf, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("the test binary lives in <target>/<profile>/deps");
    let target = profile_dir.parent().expect("a target directory above the profile's").to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(name) => name.to_string(),
        None => panic!("no profile directory in {}", exe.display()),
    };
    (target, profile)
}

/// Builds the module with cargo and returns the library it reports.
fn build() -> PathBuf {
    let (target, profile) = built_in();
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--quiet", "-p", "tollgate-redis-module", "--message-format=json-render-diagnostics"])
        .arg("--profile")
        .arg(&profile)
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(&target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo build -p tollgate-redis-module --profile {profile} failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    library_in(&stdout).unwrap_or_else(|| panic!("cargo reported no module library:\n{stdout}"))
}

/// The module's dynamic library among the artifacts of cargo's JSON messages.
fn library_in(messages: &str) -> Option<PathBuf> {
    let suffix = std::env::consts::DLL_SUFFIX;
    messages.lines().filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()).find_map(|message| {
        let artifact = message["reason"] == "compiler-artifact" && message["target"]["name"] == "tollgate_redis_module";
        let files = message["filenames"].as_array().filter(|_| artifact)?;
        files.iter().filter_map(|f| f.as_str()).find(|f| f.ends_with(suffix)).map(PathBuf::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_found_among_cargo_messages() {
        let so = format!("/t/debug/libtollgate_redis_module{}", std::env::consts::DLL_SUFFIX);
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"tollgate_core"},"filenames":["/t/debug/libtollgate_core.rlib"]}"#.to_string(),
            "not json".to_string(),
            format!(
                r#"{{"reason":"compiler-artifact","target":{{"name":"tollgate_redis_module"}},"filenames":["/t/debug/libtollgate_redis_module.rlib","{so}"]}}"#
            ),
            r#"{"reason":"build-finished","success":true}"#.to_string(),
        ]
        .join("\n");
        assert_eq!(library_in(&messages), Some(PathBuf::from(so)));
        assert_eq!(library_in(r#"{"reason":"build-finished","success":true}"#), None);
    }
}
