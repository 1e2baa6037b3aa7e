//! The schemas the API server validates the spec with.
//!
//! Hand-written where the derived one is wrong or weak: unsigned integers derive `format:
//! uint32` (a warning on every apply, and no maximum: `concurrency: 5000000000` was stored and
//! then broke every agent's list), and the duration/time strings get patterns and CEL rules so
//! the API server rejects what the agent would reject (a malformed or zero duration). Strings
//! checked by CEL carry a `maxLength`, which keeps the rules' estimated cost within the budget.

use super::DURATION_PATTERN;

pub(super) fn int_schema(min: i64, max: i64, default: i64) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "minimum": min,
        "maximum": max,
        "default": default,
    })
}

pub(super) fn concurrency_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    int_schema(1, 10_000, 1)
}

pub(super) fn max_failures_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    int_schema(0, 10_000, 1)
}

pub(super) fn grace_period_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int64",
        "minimum": 0,
        "maximum": 86_400,
        "nullable": true,
    })
}

pub(super) fn duration_schema(field: &str, default: &str) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": DURATION_PATTERN,
        "default": default,
        "x-kubernetes-validations": [{
            "rule": "self.matches('[1-9]')",
            "message": format!("{field} must be greater than 0"),
        }],
    })
}

/// `spec.maxRate`: the same grammar as `k3os-ops upgrade --max-rate` (checked again by the
/// agent, which also refuses rates below 1 KiB/s).
pub(super) fn max_rate_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": r"^[0-9]+(\.[0-9]+)?([KkMmGg](i?B)?|B)?(/s)?$",
    })
}

pub(super) fn format_version_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int64",
        "minimum": 1,
        "nullable": true,
    })
}

pub(super) fn count_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int64",
        "minimum": 0,
    })
}

pub(super) fn seed_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int64",
        "minimum": 0,
        "maximum": 999_999,
    })
}

pub(super) fn count_map_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "integer", "format": "int64", "minimum": 0},
    })
}

pub(super) fn batches_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 20,
        "items": {"type": "integer", "minimum": 1, "maximum": 100},
    })
}

/// `spec.rollout.settleTime`: a duration, zero allowed.
pub(super) fn settle_time_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": DURATION_PATTERN,
        "nullable": true,
    })
}

pub(super) fn reboot_timeout_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    duration_schema("rebootTimeout", "15m")
}

pub(super) fn drain_timeout_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    duration_schema("drain.timeout", "10m")
}

pub(super) fn window_length_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": DURATION_PATTERN,
        "x-kubernetes-validations": [
            {
                "rule": "self.matches('[1-9]')",
                "message": "window.length must be greater than 0 (and at most 7d)",
            },
            {
                // The agent's grammar sums numbers with s/m/h/d; CEL's duration() reads Go's,
                // which has no d: with days, a pattern keeps the sum within 7d (days first,
                // then at most 23h59m59s); without, duration() compares. (A rule that split
                // and summed the text was refused by the API server for its estimated cost.)
                "rule": "self.contains('d') ? self.matches('^(7d|[0-6]d(([01]?[0-9]|2[0-3])h)?([0-5]?[0-9]m)?([0-5]?[0-9]s)?)$') : duration(self) <= duration('168h')",
                "message": "window.length must be at most 7d (days first when given: 1d12h)",
            },
        ],
    })
}

pub(super) fn start_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 8,
        "x-kubernetes-validations": [{
            "rule": "self.matches('^ *([01]?[0-9]|2[0-3]):[0-5][0-9] *$')",
            "message": "window.start must be HH:MM (00:00 to 23:59)",
        }],
    })
}

pub(super) fn time_zone_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 64,
        "nullable": true,
        "x-kubernetes-validations": [
            {
                "rule": "self == '' || self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$')",
                "message": "window.timeZone must be an IANA time zone name such as Europe/Berlin or UTC",
            },
            {
                // The API server's own time-zone database decides, as the agent's does: a
                // name it does not know fails the evaluation, which refuses the object.
                "rule": "self == '' || timestamp('2000-01-01T00:00:00Z').getHours(self) >= 0",
                "message": "window.timeZone is not a time zone the cluster knows (IANA names such as Europe/Berlin or UTC)",
            },
        ],
    })
}

pub(super) fn days_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 7,
        "items": {
            "type": "string",
            "maxLength": 9,
            "x-kubernetes-validations": [{
                "rule": "self.lowerAscii() in ['mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun', 'monday', 'tuesday', 'wednesday', 'thursday', 'friday', 'saturday', 'sunday']",
                "message": "window.days: mon…sun or full English day names",
            }],
        },
    })
}

/// `spec.stage.windows[].maxRate`: as `spec.maxRate`, and `0` (nothing in that window).
pub(super) fn stage_rate_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "nullable": true,
        "x-kubernetes-validations": [{
            "rule": r"self.matches('^ *[0-9]+(\\.[0-9]+)?([KkMmGg](i?B)?|B)?(/s)? *$')",
            "message": "stage.windows[].maxRate must be a rate like 500K, 2M or 1.5MiB (bytes per second), or 0 for no download in that window",
        }],
    })
}

/// `spec.stage.maxBytesPerDay`: a byte count (`500M`, `2G`, `1.5GiB`), more than 0.
pub(super) fn max_bytes_per_day_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "nullable": true,
        "x-kubernetes-validations": [
            {
                "rule": r"self.matches('^ *[0-9]+(\\.[0-9]+)?([KkMmGg](i?B)?|B)? *$')",
                "message": "stage.maxBytesPerDay must be a byte count like 500M, 2G or 1.5GiB",
            },
            {
                "rule": "self.matches('[1-9]')",
                "message": "stage.maxBytesPerDay must be greater than 0",
            },
        ],
    })
}

/// `spec.sources`: host directories or http(s) mirrors, at most 8.
/// `spec.url`: what libupgrade's channel parser accepts — an http(s) URL with a host, a
/// `file://` URL or an absolute directory, or `github-releases://OWNER/REPO`.
pub(super) fn channel_url_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 1024,
        "x-kubernetes-validations": [{
            "rule": "(self.startsWith('http://') || self.startsWith('https://')) ? (isURL(self) && url(self).getHostname() != '') : (self.startsWith('/') || self.startsWith('file:///') || self.matches('^github-releases://[A-Za-z0-9._-]+/[A-Za-z0-9._-]+/?$'))",
            "message": "url must be an http(s) URL with a host, file:///DIR or /DIR, or github-releases://OWNER/REPO",
        }],
    })
}

/// A label selector the agent reads: equality-based only (`k=v`, `k!=v`, `k`, `!k`).
fn selector_schema(field: &str) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 256,
        "nullable": true,
        "x-kubernetes-validations": [{
            "rule": "!self.contains('(')",
            "message": format!("{field} must be an equality-based selector (k=v, k!=v, k, !k joined by commas); set-based forms (in, notin) are not supported"),
        }],
    })
}

pub(super) fn drain_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    selector_schema("drain.podSelector")
}

pub(super) fn blocking_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    selector_schema("blockingPodSelector")
}

pub(super) fn sources_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 8,
        "items": {
            "type": "string",
            "maxLength": 512,
            "x-kubernetes-validations": [{
                "rule": "self.startsWith('/') || self.startsWith('http://') || self.startsWith('https://')",
                "message": "sources[]: an absolute host directory (/…) or an http(s):// URL",
            }],
        },
    })
}
