//! Pre-reboot gates: no claim while pods matching `spec.blockingPodSelector` run on the node
//! (kured's `--blocking-pod-selector`), nor while a Prometheus alert query returns alerts
//! (`spec.prometheus`: kured's `--prometheus-url`, `--alert-filter-regexp`,
//! `--alert-filter-match-only`, `--alert-firing-only`; it asks `GET <url>/api/v1/alerts`).
//!
//! The gates are looked at only when the decision is to claim (a node that has nothing to do
//! costs nothing), right before the claim: the facts are fetched at the edge
//! ([`crate::agent::cluster::gate_probe::check`]) and
//! judged by pure functions ([`blocking_pods`], [`alerts_blocking`]). A Prometheus that does
//! not answer blocks the claim (the safe side: an alert could be firing), and the reason names
//! the URL and the error.
//!
//! The alert filter is a `regex` (the crate this binary already links through
//! tracing-subscriber; kured's filter is a Go regexp of the same syntax for such names).

use k8s_openapi::api::core::v1::Pod;
use regex::Regex;

use super::crd::PrometheusSpec;
use super::selector::Selector;

/// `spec.blockingPodSelector` and `spec.prometheus`, parsed.
#[derive(Debug, Clone, Default)]
pub struct Gates {
    pub blocking_pods: Option<Selector>,
    pub prometheus: Option<Prometheus>,
}

/// `spec.prometheus`, parsed.
#[derive(Debug, Clone)]
pub struct Prometheus {
    pub url: String,
    /// Alerts whose name matches are ignored (or, with `match_only`, the only ones counted).
    pub filter: Option<Regex>,
    pub match_only: bool,
    /// Only `firing` alerts block (else `pending` ones too).
    pub firing_only: bool,
}

impl Gates {
    /// Parse the gate fields of the spec; the error names the field.
    pub fn from_spec(
        blocking: Option<&str>,
        prometheus: Option<&PrometheusSpec>,
    ) -> Result<Gates, String> {
        let blocking_pods = blocking
            .map(|s| {
                Selector::parse(s).map_err(|_| {
                    format!("spec.blockingPodSelector: '{s}' is not a label selector (k=v, k!=v, k, !k joined by commas)")
                })
            })
            .transpose()?;
        let prometheus = prometheus
            .map(|p| {
                if !(p.url.starts_with("http://") || p.url.starts_with("https://")) {
                    return Err(format!(
                        "spec.prometheus.url: '{}' is not an http(s) URL",
                        p.url
                    ));
                }
                let filter = p
                    .alert_filter
                    .as_deref()
                    .map(|f| {
                        Regex::new(f).map_err(|e| {
                            format!("spec.prometheus.alertFilter: '{f}' is not a regular expression: {e}")
                        })
                    })
                    .transpose()?;
                Ok(Prometheus {
                    url: p.url.trim_end_matches('/').to_string(),
                    filter,
                    match_only: p.alert_filter_match_only,
                    firing_only: p.firing_only,
                })
            })
            .transpose()?;
        Ok(Gates {
            blocking_pods,
            prometheus,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.blocking_pods.is_none() && self.prometheus.is_none()
    }
}

/// The pods of `pods` (all on the node) that block a reboot: running (not finished) and
/// matching `selector`; `namespace/name` each.
pub fn blocking_pods(pods: &[Pod], selector: &Selector) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| selector.matches(&p.metadata.labels.clone().unwrap_or_default()))
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// The names of the alerts in a Prometheus `/api/v1/alerts` answer that block a reboot under
/// `p`, or why the answer cannot be read.
pub fn alerts_blocking(p: &Prometheus, answer: &serde_json::Value) -> Result<Vec<String>, String> {
    if answer["status"] != "success" {
        return Err(format!(
            "the answer's status is {} (not success)",
            answer["status"]
        ));
    }
    let alerts = answer
        .pointer("/data/alerts")
        .and_then(|a| a.as_array())
        .ok_or("the answer has no data.alerts list")?;
    let mut names: Vec<String> = alerts
        .iter()
        .filter(|a| !p.firing_only || a["state"] == "firing")
        .filter_map(|a| a.pointer("/labels/alertname").and_then(|n| n.as_str()))
        .filter(|n| match &p.filter {
            None => true,
            Some(f) => f.is_match(n) == p.match_only,
        })
        .map(String::from)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prom(filter: Option<&str>, match_only: bool, firing_only: bool) -> Prometheus {
        Prometheus {
            url: "http://127.0.0.1:9090".into(),
            filter: filter.map(|f| Regex::new(f).unwrap()),
            match_only,
            firing_only,
        }
    }

    fn alerts(list: &[(&str, &str)]) -> serde_json::Value {
        let alerts: Vec<_> = list
            .iter()
            .map(|(n, s)| json!({"labels": {"alertname": n}, "state": s}))
            .collect();
        json!({"status": "success", "data": {"alerts": alerts}})
    }

    #[test]
    fn alerts_are_filtered_as_kured_does() {
        let a = alerts(&[
            ("Watchdog", "firing"),
            ("DiskFull", "pending"),
            ("NodeDown", "firing"),
        ]);
        assert_eq!(
            alerts_blocking(&prom(None, false, false), &a).unwrap(),
            ["DiskFull", "NodeDown", "Watchdog"]
        );
        // The filter names alerts to ignore …
        assert_eq!(
            alerts_blocking(&prom(Some("^Watchdog$"), false, false), &a).unwrap(),
            ["DiskFull", "NodeDown"]
        );
        // … or, match-only, the only ones that count; firing-only drops pending ones.
        assert_eq!(
            alerts_blocking(&prom(Some("Disk|Node"), true, true), &a).unwrap(),
            ["NodeDown"]
        );
        assert!(alerts_blocking(&prom(None, false, false), &json!({"status": "error"})).is_err());
    }

    #[test]
    fn bad_gate_fields_are_named() {
        let e = Gates::from_spec(Some("a=b,=c"), None).unwrap_err();
        assert!(e.contains("spec.blockingPodSelector"), "{e}");
        let p = PrometheusSpec {
            url: "http://127.0.0.1:9090".into(),
            alert_filter: Some("(".into()),
            alert_filter_match_only: false,
            firing_only: false,
        };
        let e = Gates::from_spec(None, Some(&p)).unwrap_err();
        assert!(e.contains("spec.prometheus.alertFilter"), "{e}");
        let p = PrometheusSpec {
            url: "prometheus:9090".into(),
            ..p
        };
        let e = Gates::from_spec(None, Some(&p)).unwrap_err();
        assert!(e.contains("spec.prometheus.url"), "{e}");
    }
}
