//! What `site-upgrade` saw while the agent upgraded the node, and the judgement of it: one
//! [`Sample`] per poll of the API server and the console (host clock), and the agent's Events
//! (its own clock); [`judge`] checks the order a user must see and returns the step times.
//! Pure: the scenario gathers, this decides.

use std::fmt;

/// One poll: the Node as the API server has it, the workload, and the guest's console so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Sample {
    /// Seconds since the UpdateChannel was applied.
    pub at: u64,
    /// The Node's `k3os.io/update-phase` (empty: none).
    pub phase: String,
    /// The Node carries `k3os.io/update-stage-preview`.
    pub preview: bool,
    /// `spec.unschedulable`.
    pub cordoned: bool,
    /// The Node's Ready condition (`True`, `False`, `Unknown`, empty).
    pub ready: String,
    /// Ready replicas of the workload.
    pub web_ready: u32,
    /// Console: `K3OS-SHUTDOWN reboot` lines.
    pub shutdowns: usize,
    /// Console: a `K3OS-BOOTED slot=B` line.
    pub booted_b: bool,
    /// Console: `K3OS-KUBE imported` lines (one per boot).
    pub imported: usize,
    /// Console: `K3OS-KUBE kubelet` lines (one per boot).
    pub kubelets: usize,
}

impl Sample {
    /// The same observation, whatever the time.
    pub(super) fn same(&self, o: &Sample) -> bool {
        Sample {
            at: 0,
            ..self.clone()
        } == Sample { at: 0, ..o.clone() }
    }
}

impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t={}s phase={} preview={} cordoned={} Ready={} {}={} console: shutdowns={} B={} imported={} kubelets={}",
            self.at,
            if self.phase.is_empty() { "-" } else { &self.phase },
            self.preview,
            self.cordoned,
            if self.ready.is_empty() { "-" } else { &self.ready },
            super::manifests::WEB,
            self.web_ready,
            self.shutdowns,
            self.booted_b,
            self.imported,
            self.kubelets
        )
    }
}

/// The samples that differ from the one before (the transitions, for the notes and errors).
pub(super) fn transitions(samples: &[Sample]) -> Vec<&Sample> {
    let mut out: Vec<&Sample> = Vec::new();
    for s in samples {
        if out.last().is_none_or(|l| !l.same(s)) {
            out.push(s);
        }
    }
    out
}

/// One of the agent's Events about the Node: its reason and time (seconds on the agent's
/// clock, from any origin).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AgentEvent {
    pub reason: String,
    pub at: f64,
    pub note: String,
}

/// The Events a user must see, in this order (the agent's reasons, agent/reconcile).
pub(super) const EVENT_ORDER: [&str; 8] = [
    "Staged",
    "Cordoned",
    "Draining",
    "Drained",
    "Activated",
    "Rebooting",
    "Confirming",
    "UpdateSucceeded",
];

/// The step times of an upgrade that went as it must.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Figures {
    /// Agent clock: the claim to the bless (`SlotClaimed` → `UpdateSucceeded`).
    pub claim_to_blessed: f64,
    /// Agent clock: `Staging` → `Staged`.
    pub stage: f64,
    /// Agent clock: `Draining` → `Drained`.
    pub drain: f64,
    /// Host clock: `K3OS-SHUTDOWN reboot` → `K3OS-BOOTED slot=B` (± one poll).
    pub reboot: u64,
    /// Host clock: `K3OS-BOOTED slot=B` → the Node Ready again after B's kubelet started.
    pub kubelet_ready: u64,
    /// Agent clock: `Confirming` → `UpdateSucceeded`.
    pub confirm: f64,
    /// Host clock: how long the workload had no Ready replica (± one poll).
    pub web_down: u64,
    /// The Events' reasons in order, for the notes.
    pub events: Vec<String>,
}

/// Judge what was seen: the stage preview on the Node before the cordon, the Events in
/// [`EVENT_ORDER`] (each once at least, first occurrences in order), the console's reboot into
/// B with its images imported and the kubelet started again, the Node Ready and uncordoned at
/// the end. The error says what was out of place.
pub(super) fn judge(samples: &[Sample], events: &[AgentEvent]) -> Result<Figures, String> {
    let first = |p: &dyn Fn(&Sample) -> bool, what: &str| {
        samples
            .iter()
            .find(|s| p(s))
            .ok_or_else(|| format!("never seen: {what}"))
    };
    let preview = first(&|s| s.preview, "the stage preview annotation on the Node")?;
    if preview.cordoned {
        return Err(format!(
            "the stage preview appeared only once the Node was cordoned ({preview})"
        ));
    }
    let cordon = first(&|s| s.cordoned, "the Node cordoned")?;
    let shutdown = first(&|s| s.shutdowns > 0, "K3OS-SHUTDOWN reboot on the console")?;
    let booted = first(&|s| s.booted_b, "K3OS-BOOTED slot=B on the console")?;
    let kubelet = first(
        &|s| s.booted_b && s.imported >= 2 && s.kubelets >= 2,
        "B's images imported and its kubelet started",
    )?;
    let ready = first(
        &|s| s.at >= kubelet.at && s.ready == "True",
        "the Node Ready after B's kubelet started",
    )?;
    let last = samples.last().ok_or("no sample")?;
    if last.cordoned || last.ready != "True" || last.phase != "UpToDate" {
        return Err(format!(
            "the Node at the end must be Ready, uncordoned and UpToDate: {last}"
        ));
    }
    if !(cordon.at <= shutdown.at && shutdown.at <= booted.at) {
        return Err(format!(
            "out of order: cordon {cordon}, shutdown {shutdown}, boot of B {booted}"
        ));
    }
    let at = |reason: &str| {
        events
            .iter()
            .find(|e| e.reason == reason)
            .map(|e| e.at)
            .ok_or_else(|| format!("no Event {reason} (Events: {})", reasons(events).join(", ")))
    };
    let mut prev = (String::new(), f64::MIN);
    for r in EVENT_ORDER {
        let t = at(r)?;
        if t < prev.1 {
            return Err(format!(
                "Event {r} came before {} (Events: {})",
                prev.0,
                reasons(events).join(", ")
            ));
        }
        prev = (r.to_string(), t);
    }
    if at("SlotClaimed")? > at("Cordoned")? {
        return Err(format!(
            "the slot was claimed after the cordon (Events: {})",
            reasons(events).join(", ")
        ));
    }
    Ok(Figures {
        claim_to_blessed: at("UpdateSucceeded")? - at("SlotClaimed")?,
        stage: at("Staged")? - at("Staging")?,
        drain: at("Drained")? - at("Draining")?,
        reboot: booted.at - shutdown.at,
        kubelet_ready: ready.at - booted.at,
        confirm: at("UpdateSucceeded")? - at("Confirming")?,
        web_down: down_time(samples),
        events: reasons(events),
    })
}

fn reasons(events: &[AgentEvent]) -> Vec<String> {
    events.iter().map(|e| e.reason.clone()).collect()
}

/// Seconds in which the workload had no Ready replica, between the first sample that had one
/// and the last.
fn down_time(samples: &[Sample]) -> u64 {
    let mut down = 0;
    let mut since: Option<u64> = None;
    let mut seen_up = false;
    for s in samples {
        match (s.web_ready > 0, since) {
            (true, Some(t)) => {
                down += s.at - t;
                since = None;
            }
            (false, None) if seen_up => since = Some(s.at),
            _ => {}
        }
        seen_up |= s.web_ready > 0;
    }
    down
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: u64, phase: &str, f: impl FnOnce(&mut Sample)) -> Sample {
        let mut x = Sample {
            at,
            phase: phase.into(),
            ready: "True".into(),
            web_ready: 1,
            imported: 1,
            kubelets: 1,
            ..Sample::default()
        };
        f(&mut x);
        x
    }

    fn good() -> (Vec<Sample>, Vec<AgentEvent>) {
        let samples = vec![
            s(0, "", |_| {}),
            s(10, "Staging", |_| {}),
            s(40, "Staged", |x| x.preview = true),
            s(50, "Draining", |x| (x.preview, x.cordoned) = (true, true)),
            s(70, "Rebooting", |x| {
                (x.preview, x.cordoned, x.web_ready) = (true, true, 0)
            }),
            s(72, "Rebooting", |x| {
                (x.cordoned, x.web_ready, x.shutdowns, x.ready) = (true, 0, 1, "Unknown".into())
            }),
            s(100, "Rebooting", |x| {
                (x.cordoned, x.web_ready, x.shutdowns, x.booted_b) = (true, 0, 1, true);
                x.ready = "Unknown".into();
            }),
            s(150, "Confirming", |x| {
                (x.cordoned, x.web_ready, x.shutdowns, x.booted_b) = (true, 0, 1, true);
                (x.imported, x.kubelets) = (2, 2);
            }),
            s(160, "UpToDate", |x| {
                (x.shutdowns, x.booted_b, x.imported, x.kubelets) = (1, true, 2, 2);
            }),
        ];
        let events = [
            ("Staging", 1.0),
            ("Staged", 30.0),
            ("SlotClaimed", 31.0),
            ("Cordoned", 32.0),
            ("Draining", 33.0),
            ("Drained", 45.0),
            ("Activated", 46.0),
            ("Rebooting", 47.0),
            ("Confirming", 140.0),
            ("UpdateSucceeded", 150.0),
            ("SlotReleased", 151.0),
        ]
        .map(|(r, at)| AgentEvent {
            reason: r.into(),
            at,
            note: String::new(),
        })
        .to_vec();
        (samples, events)
    }

    #[test]
    fn an_upgrade_in_order_gives_its_step_times() {
        let (samples, events) = good();
        let f = judge(&samples, &events).unwrap();
        assert_eq!(f.claim_to_blessed, 119.0);
        assert_eq!((f.stage, f.drain, f.confirm), (29.0, 12.0, 10.0));
        assert_eq!((f.reboot, f.kubelet_ready, f.web_down), (28, 50, 90));
        assert_eq!(transitions(&samples).len(), samples.len());
    }

    #[test]
    fn each_step_out_of_place_is_named() {
        let (mut samples, events) = good();
        samples[2].cordoned = true;
        let e = judge(&samples, &events).unwrap_err();
        assert!(
            e.contains("preview appeared only once the Node was cordoned"),
            "{e}"
        );

        let (samples, mut events) = good();
        events[5].at = 32.5;
        let e = judge(&samples, &events).unwrap_err();
        assert!(e.contains("Event Drained came before Draining"), "{e}");

        let (mut samples, events) = good();
        samples.last_mut().unwrap().cordoned = true;
        let e = judge(&samples, &events).unwrap_err();
        assert!(e.contains("uncordoned"), "{e}");

        let (samples, mut events) = good();
        events.retain(|e| e.reason != "UpdateSucceeded");
        let e = judge(&samples, &events).unwrap_err();
        assert!(e.contains("no Event UpdateSucceeded"), "{e}");
    }
}
