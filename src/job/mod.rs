//! The job, as the contract defines it: decoding a body ([`mod@decode`]), the headers
//! that travel with it ([`headers`]), what became of it ([`outcome`]) and what the
//! worker notes about it for `admin job` ([`record`]). Pure.

pub mod decode;
pub mod headers;
pub mod outcome;
pub mod record;

pub use decode::{decode, Job, Malformed};
pub use outcome::{Outcome, Reason};
