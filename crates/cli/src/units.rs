//! Values given on the command line with units: durations (`500ms`, `10s`, `2m`) and sizes
//! (`64KiB`, `512MiB`, `1GiB`, or plain bytes). Zero is refused where it would mean "nothing
//! allowed", with the flag named by clap.

use std::path::PathBuf;
use std::time::Duration;

/// A duration: a number and a unit among ns, us, ms, s, m, h, d (e.g. `10s`, `250ms`).
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let ns = tollgate_core::parse_period_ns(text).map_err(|e| e.to_string())?;
    if ns == 0 {
        return Err("must be longer than 0".into());
    }
    Ok(Duration::from_nanos(ns))
}

/// A bound in time that may be turned off: a duration, or `0` / `never` for none (as Redis's
/// `timeout 0`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeout(pub(crate) Option<Duration>);

/// A [`Timeout`]: a duration such as `5m`, or `0` or `never`.
pub(crate) fn timeout(text: &str) -> Result<Timeout, String> {
    match text.trim() {
        "0" | "never" => Ok(Timeout(None)),
        text => duration(text).map(|d| Timeout(Some(d))).map_err(|e| format!("{e} (or 0, never: no bound)")),
    }
}

/// A size in bytes: a number, optionally followed by KiB, MiB or GiB (or K, M, G, powers of 1024).
pub(crate) fn bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: usize = number.parse().map_err(|_| format!("{text:?} is not a size such as 65536, 64KiB or 512MiB"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => return Err(format!("unknown unit {other:?}: use KiB, MiB or GiB (or none for bytes)")),
    };
    let size = number.checked_shl(shift).filter(|s| s >> shift == number).ok_or("too large")?;
    if size == 0 {
        return Err("must be at least 1 byte".into());
    }
    Ok(size)
}

/// A count of at least 1.
pub(crate) fn positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// The most worker threads `serve` starts: far above any machine's cores, low enough that a typo
/// (`--workers 1000000`) is refused with the flag's name instead of starting threads until the
/// process runs out of file descriptors.
pub(crate) const MAX_WORKERS: usize = 1024;

/// A worker count: 1 to [`MAX_WORKERS`].
pub(crate) fn workers(text: &str) -> Result<usize, String> {
    match positive(text)? {
        n if n > MAX_WORKERS => Err(format!("at most {MAX_WORKERS} worker threads")),
        n => Ok(n),
    }
}

/// A listen address, `HOST:PORT`: an IP address or a name that resolves (`localhost:6380`).
pub(crate) fn address(text: &str) -> Result<String, String> {
    use std::net::ToSocketAddrs;
    if text.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(text.to_string());
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} is not HOST:PORT (e.g. 127.0.0.1:6380 or localhost:6380)"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{text:?} is not HOST:PORT with a port from 0 to 65535 (e.g. localhost:6380)"));
    }
    match text.to_socket_addrs().map(|mut addresses| addresses.next()) {
        Ok(Some(_)) => Ok(text.to_string()),
        Ok(None) => Err(format!("{host:?} resolves to no address")),
        Err(e) => Err(format!("{host:?} does not resolve: {e}")),
    }
}

/// A log filter: a level (error, warn, info, debug, trace, off) or tracing directives
/// (`info,tollgate_engine=debug`). A bare word that is not a level would be read as a target
/// name and silence every other log line (`infoo`): it is refused.
pub(crate) fn log_filter(text: &str) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let usage = "use error, warn, info, debug, trace or off, or directives such as info,tollgate_engine=debug";
    for directive in text.split(',') {
        let directive = directive.trim();
        let level = directive.rsplit_once('=').map_or(directive, |(_, level)| level);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!("{directive:?} is not a log level: {usage}"));
        }
    }
    tracing_subscriber::EnvFilter::try_new(text).map_err(|e| format!("{e}: {usage}"))?;
    Ok(text.to_string())
}

/// The extensions `--plot` writes.
const SUPPORTED: &str = ".svg";

/// A `--plot` value: a path ending in `.svg` (any case). Anything else is refused before
/// the experiment runs, rather than written as SVG under a name that says otherwise.
pub(crate) fn svg_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("svg") => Ok(path),
        Some(ext) if ext.eq_ignore_ascii_case("png") => Err(format!(
            "PNG is not built in (supported: {SUPPORTED}); write an SVG and convert it, e.g. \
             rsvg-convert -o {text} {}",
            path.with_extension("svg").display()
        )),
        Some(ext) => Err(format!("cannot plot to a .{ext} file (supported: {SUPPORTED})")),
        None => Err(format!("the file name has no extension (supported: {SUPPORTED})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_durations() {
        assert_eq!(bytes("65536"), Ok(65536));
        assert_eq!(bytes("64KiB"), Ok(65536));
        assert_eq!(bytes("512MiB"), Ok(512 << 20));
        assert_eq!(bytes("1G"), Ok(1 << 30));
        assert!(bytes("0").is_err() && bytes("5 furlongs").is_err() && bytes("99999999999999999999G").is_err());
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(duration("0s").is_err() && duration("10").is_err());
        assert_eq!(positive("3"), Ok(3));
        assert!(positive("0").is_err());
        assert_eq!(timeout("5m").map(|t| t.0), Ok(Some(Duration::from_secs(300))));
        assert_eq!(timeout("0").map(|t| t.0), Ok(None));
        assert_eq!(timeout("never").map(|t| t.0), Ok(None));
        assert!(timeout("0s").is_err() && timeout("5").unwrap_err().contains("never"));
    }

    #[test]
    fn parses_addresses_and_log_filters() {
        for good in ["127.0.0.1:6380", "localhost:6380", "[::1]:0", "0.0.0.0:8080"] {
            assert_eq!(address(good).as_deref(), Ok(good));
        }
        for bad in ["localhost", "localhost:99999", ":6380", "6380"] {
            assert!(address(bad).is_err(), "{bad}");
        }
        for good in ["info", "DEBUG", "off", "info,tollgate_engine=debug", "tollgate=trace"] {
            assert_eq!(log_filter(good).as_deref(), Ok(good));
        }
        for bad in ["infoo", "", "info,verbose", "tollgate=loud"] {
            assert!(log_filter(bad).unwrap_err().contains("use error, warn, info"), "{bad}");
        }
    }

    #[test]
    fn only_svg_names_are_accepted() {
        assert_eq!(svg_path("out/plot.SVG").unwrap(), PathBuf::from("out/plot.SVG"));
        for (name, wanted) in [
            (
                "plot.png",
                "PNG is not built in (supported: .svg); write an SVG and convert it, e.g. rsvg-convert -o plot.png plot.svg",
            ),
            ("plot.txt", "cannot plot to a .txt file (supported: .svg)"),
            ("plot", "the file name has no extension (supported: .svg)"),
        ] {
            assert_eq!(svg_path(name).unwrap_err(), wanted);
        }
    }
}
