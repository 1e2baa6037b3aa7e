//! Moving bytes over a link: the one HTTP client ([`http`]), release sources and the rules
//! every response body is read under (`fetch`: minimum rate, deadline, what a failure means),
//! the one retry policy (`retry`), the checkpoint a streamed download resumes from
//! (`checkpoint`), a token-bucket limit on the bytes read from the network with the byte
//! budget of an attempt and the clock a download schedule is followed on (`rate`), and when a
//! stage may fetch and how fast (`schedule`, pure: absolute UTC windows). Private: the crate
//! root re-exports the API.

pub(crate) mod checkpoint;
pub(crate) mod fetch;
pub mod http;
pub(crate) mod rate;
pub(crate) mod retry;
pub(crate) mod schedule;
