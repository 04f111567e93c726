//! Store URLs checked in tollgate's own words before anything starts: `redis://[user:password@]
//! host[:port][/db]` for one server, `redis+cluster://host:port,host:port` for a cluster. The
//! driver would accept some mistakes and report others only at the first call, in its own terms
//! (`Missing hostname - InvalidClientConfig`); here each one is refused with what is wrong and an
//! example of a valid URL. [`redacted`] is the form that may be logged: never the credentials.

const EXAMPLE: &str = "e.g. redis://127.0.0.1:6379 or redis://:password@10.0.0.5:6379/2";

/// Checks one server's URL (`redis://...`), returning it unchanged when valid.
pub fn check_redis(text: &str) -> Result<String, String> {
    let problem = |what: String| Err(format!("invalid Redis URL {:?}: {what} ({EXAMPLE})", redacted(text)));
    let Some(rest) = text.strip_prefix("redis://") else {
        if text.starts_with("rediss://") {
            return problem("TLS (rediss://) is not built into tollgate; reach Redis over redis:// on a trusted network or through a TLS tunnel".into());
        }
        return problem("it must start with redis://".into());
    };
    if rest.contains(['?', '#']) {
        return problem("URL options (?...) are not supported".into());
    }
    let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = split_port(host_port);
    if host.is_empty() {
        return problem("no host".into());
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return problem(format!("the port {port:?} is not a number from 1 to 65535")),
        }
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return problem(format!("the database {db:?} is not a number (Redis numbers its databases 0, 1, 2...)"));
    }
    Ok(text.to_string())
}

/// Checks a cluster's URL (`redis+cluster://host:port,host:port`), returning each node as a
/// `redis://` URL.
pub fn check_cluster(text: &str) -> Result<Vec<String>, String> {
    let nodes = text.strip_prefix("redis+cluster://").unwrap_or(text);
    let nodes: Vec<&str> = nodes.split(',').filter(|n| !n.trim().is_empty()).collect();
    if nodes.is_empty() {
        return Err(format!(
            "invalid Redis Cluster URL {:?}: no node (e.g. redis+cluster://10.0.0.1:7000,10.0.0.2:7000)",
            redacted(text)
        ));
    }
    nodes
        .into_iter()
        .map(|node| {
            let url = check_redis(&format!("redis://{}", node.trim()))?;
            if url.trim_start_matches("redis://").split_once('/').is_some_and(|(_, db)| !db.is_empty()) {
                return Err(format!(
                    "invalid Redis Cluster node {:?}: a cluster has only database 0, give no /db",
                    redacted(&url)
                ));
            }
            Ok(url)
        })
        .collect()
}

/// `host:port` split at the port's colon (an IPv6 host is in brackets: `[::1]:6379`).
fn split_port(text: &str) -> (&str, Option<&str>) {
    if let Some(rest) = text.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => ("", None),
        };
    }
    match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    }
}

/// The URL without its credentials (`redis://:secret@h:1/2` is `redis://h:1/2`), for logs and
/// errors.
pub fn redacted(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else { return text.to_string() };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let hosts: Vec<&str> =
        authority.split(',').map(|node| node.rsplit_once('@').map_or(node, |(_, host)| host)).collect();
    format!("{scheme}://{}{path}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_urls_pass_unchanged() {
        for url in ["redis://127.0.0.1:6379", "redis://h", "redis://:pw@h:1/15", "redis://u:p@[::1]:6379/0"] {
            assert_eq!(check_redis(url).as_deref(), Ok(url));
        }
        assert_eq!(check_cluster("redis+cluster://a:1,b:2").unwrap(), ["redis://a:1", "redis://b:2"]);
    }

    #[test]
    fn every_mistake_is_named_with_an_example() {
        for (url, wanted) in [
            ("redis://", "no host"),
            ("redis://:6379", "no host"),
            ("rediss://h:1", "TLS (rediss://) is not built into tollgate"),
            ("http://h:1", "must start with redis://"),
            ("redis://h:99999", "port \"99999\" is not a number from 1 to 65535"),
            ("redis://h:0", "port \"0\""),
            ("redis://h:1/x", "database \"x\" is not a number"),
            ("redis://h:1/?protocol=resp3", "options"),
        ] {
            let error = check_redis(url).unwrap_err();
            assert!(error.contains(wanted) && error.contains("e.g. redis://127.0.0.1:6379"), "{url}: {error}");
        }
        assert!(check_cluster("redis+cluster://").unwrap_err().contains("no node"));
        assert!(check_cluster("redis+cluster://a:1/3").unwrap_err().contains("only database 0"));
    }

    #[test]
    fn credentials_never_reach_a_message() {
        assert_eq!(redacted("redis://user:secret@h:1/2"), "redis://h:1/2");
        assert_eq!(redacted("redis+cluster://:s@a:1,:s@b:2"), "redis+cluster://a:1,b:2");
        let error = check_redis("redis://:secret@h:1/x").unwrap_err();
        assert!(!error.contains("secret"), "{error}");
    }
}
