//! Moving bytes over a link: the one HTTP client ([`http`]), release sources and the rules
//! every response body is read under (`fetch`: minimum rate, deadline, what a failure means),
//! the one retry policy (`retry`), and the checkpoint a streamed download resumes from
//! (`checkpoint`). Private: the crate root re-exports the API.

pub(crate) mod checkpoint;
pub(crate) mod fetch;
pub mod http;
pub(crate) mod retry;
