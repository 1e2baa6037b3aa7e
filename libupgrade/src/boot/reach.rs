//! The reachability check after a trial boot: on a single-node site, Node-Ready is local and
//! proves nothing about whether the site can still be reached, so a release that breaks the
//! network must roll back by itself. When the node's config has a `[reachability]` table,
//! every activation awaits the built-in check [`CHECK`] (the [`AwaitedChecks`] machinery: the
//! boot-time `confirm` leaves the trial boot pending), and `slot await-bless` probes the
//! endpoints until one answers — then it reports the check passed through the one bless point
//! — or the limit passes, when it reports it failed, naming the endpoints, and the node rolls
//! back.
//!
//! ```toml
//! [reachability]
//! endpoints = ["https://updates.example.com/", "tcp://10.0.0.1:6443"]  # default: the URL the
//! within_secs = 600                                                   # slot was staged from
//! ```
//!
//! A probe is a TCP connect (`tcp://host:port`) or an HTTP(S) request (`https://…`,
//! `http://…`) where any HTTP answer counts: name resolution, routing and (for https) TLS
//! worked. Decisions ([`awaits_with`], [`endpoints`]) are pure; [`probe`] and [`probe_any`]
//! are the effects.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::state::AwaitedChecks;

/// The name the check is awaited and reported under.
pub const CHECK: &str = "reachable";

/// How long one probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The `[reachability]` table of the node's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reachability {
    /// `https://…`, `http://…` or `tcp://host:port`; empty: the http(s) URL the trial slot's
    /// release was staged from.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// How long after the trial boot one of them must answer.
    #[serde(default = "default_within")]
    pub within_secs: u64,
}

pub(crate) fn default_within() -> u64 {
    600
}

/// One endpoint to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `tcp://host:port`: reachable when a TCP connection opens.
    Tcp {
        /// Host name or IP address (IPv6 without brackets).
        host: String,
        /// TCP port.
        port: u16,
    },
    /// An `http(s)://` URL: reachable when the server answers with any HTTP status.
    Http(String),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::Http(url) => f.write_str(url),
        }
    }
}

impl Endpoint {
    /// `tcp://host:port`, `https://…` or `http://…`.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        let s = s.trim();
        if s.starts_with("https://") || s.starts_with("http://") {
            return Ok(Endpoint::Http(s.to_string()));
        }
        let bad = || {
            format!("reachability endpoint '{s}': expected https://…, http://… or tcp://host:port")
        };
        let hp = s.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = hp.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse().map_err(|_| bad())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Endpoint::Tcp {
            host: host.to_string(),
            port,
        })
    }
}

/// The checks an activation awaits once the config's reachability check is added to the
/// caller's (`within_secs`: the longer of the two limits). Unchanged without one.
pub fn awaits_with(
    awaits: Option<AwaitedChecks>,
    cfg: Option<&Reachability>,
) -> Option<AwaitedChecks> {
    let Some(r) = cfg else {
        return awaits;
    };
    let mut a = awaits.unwrap_or(AwaitedChecks {
        names: Vec::new(),
        within_secs: r.within_secs,
    });
    if !a.names.iter().any(|n| n == CHECK) {
        a.names.push(CHECK.to_string());
    }
    a.within_secs = a.within_secs.max(r.within_secs);
    Some(a)
}

/// The endpoints to probe: the configured ones, else the http(s) URL the slot's release was
/// staged from. An error names what is wrong (a malformed endpoint, or none at all).
pub fn endpoints(cfg: &Reachability, staged_from: Option<&str>) -> Result<Vec<Endpoint>, String> {
    if cfg.endpoints.is_empty() {
        return match staged_from.map(Endpoint::parse) {
            Some(Ok(e @ Endpoint::Http(_))) => Ok(vec![e]),
            _ => Err(format!(
                "[reachability] has no endpoints and the slot was not staged from an http(s) URL ({}); list endpoints in the config",
                staged_from.unwrap_or("no source recorded")
            )),
        };
    }
    cfg.endpoints.iter().map(|s| Endpoint::parse(s)).collect()
}

/// Probe one endpoint: what answered, or why not.
pub fn probe(e: &Endpoint, timeout: Duration) -> Result<String, String> {
    match e {
        Endpoint::Tcp { host, port } => {
            let addrs = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|err| format!("cannot resolve {host}: {err}"))?;
            let mut last = format!("{host} resolves to no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(_) => return Ok(format!("{e} accepted a connection")),
                    Err(err) => last = err.to_string(),
                }
            }
            Err(last)
        }
        Endpoint::Http(url) => {
            let client = crate::net::http::client().map_err(|err| err.to_string())?;
            match client.get(url).timeout(timeout).send() {
                Ok(r) => Ok(format!("{e} answered HTTP {}", r.status().as_u16())),
                Err(err) => Err(crate::error::chain_line(&err)),
            }
        }
    }
}

/// Probe `endpoints` in order until one answers: what answered, or every endpoint with why
/// it did not.
pub fn probe_any(endpoints: &[Endpoint], timeout: Duration) -> Result<String, String> {
    let mut why = Vec::new();
    for e in endpoints {
        match probe(e, timeout) {
            Ok(ok) => return Ok(ok),
            Err(err) => why.push(format!("{e} ({err})")),
        }
    }
    Err(format!("none of {} answered", why.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_table_is_optional_and_its_keys_are_checked() {
        let base = "bootloader = \"grub\"\n[layout]\nkind = \"gpt\"\ndisk = \"/dev/vda\"\nboot_dir = \"/boot\"\n";
        assert_eq!(crate::Config::parse(base).unwrap().reachability, None);
        let c = crate::Config::parse(&format!(
            "{base}[reachability]\nendpoints = [\"tcp://10.0.0.1:6443\"]\n"
        ))
        .unwrap();
        assert_eq!(
            c.reachability,
            Some(Reachability {
                endpoints: vec!["tcp://10.0.0.1:6443".into()],
                within_secs: 600
            })
        );
        let e = crate::Config::parse(&format!("{base}[reachability]\nwithin = 5\n")).unwrap_err();
        assert!(e.contains("within"), "{e}");
    }

    #[test]
    fn endpoints_parse_or_are_refused_by_name() {
        assert_eq!(
            Endpoint::parse("tcp://127.0.0.1:6443"),
            Ok(Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 6443
            })
        );
        assert_eq!(
            Endpoint::parse("https://x.example/"),
            Ok(Endpoint::Http("https://x.example/".into()))
        );
        for bad in ["tcp://host", "tcp://:80", "ftp://x", "tcp://h:99999"] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn the_reachability_check_joins_the_awaited_checks_with_the_longer_limit() {
        let r = Reachability {
            endpoints: vec![],
            within_secs: 300,
        };
        assert_eq!(awaits_with(None, None), None);
        let node_ready = AwaitedChecks {
            names: vec!["node-ready".into()],
            within_secs: 600,
        };
        assert_eq!(
            awaits_with(Some(node_ready.clone()), None),
            Some(node_ready.clone())
        );
        assert_eq!(
            awaits_with(None, Some(&r)),
            Some(AwaitedChecks {
                names: vec![CHECK.into()],
                within_secs: 300
            })
        );
        let both = awaits_with(Some(node_ready), Some(&r)).unwrap();
        assert_eq!(both.names, ["node-ready", CHECK]);
        assert_eq!(both.within_secs, 600);
        // Idempotent.
        assert_eq!(awaits_with(Some(both.clone()), Some(&r)), Some(both));
    }

    #[test]
    fn the_default_endpoint_is_the_url_the_slot_was_staged_from() {
        let r = Reachability {
            endpoints: vec![],
            within_secs: 300,
        };
        assert_eq!(
            endpoints(&r, Some("https://u.example/v2/manifest.json")),
            Ok(vec![Endpoint::Http(
                "https://u.example/v2/manifest.json".into()
            )])
        );
        let e = endpoints(&r, Some("/media/usb/v2/manifest.json")).unwrap_err();
        assert!(e.contains("/media/usb/v2/manifest.json") && e.contains("list endpoints"));
        let r = Reachability {
            endpoints: vec!["tcp://127.0.0.1:1".into(), "bogus".into()],
            within_secs: 300,
        };
        assert!(endpoints(&r, None).unwrap_err().contains("'bogus'"));
    }

    #[test]
    fn a_listener_answers_and_a_closed_port_does_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = Endpoint::parse(&format!("tcp://{}", l.local_addr().unwrap())).unwrap();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            Endpoint::parse(&format!("tcp://{}", l.local_addr().unwrap())).unwrap()
        };
        let t = Duration::from_secs(2);
        let why = probe_any(std::slice::from_ref(&closed), t).unwrap_err();
        assert!(why.contains(&closed.to_string()), "{why}");
        let ok = probe_any(&[closed, open.clone()], t).unwrap();
        assert!(ok.contains(&open.to_string()), "{ok}");
    }
}
