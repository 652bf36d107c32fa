//! The job, as the contract defines it: decoding a body ([`mod@decode`]), the headers
//! that travel with it ([`headers`]), and what became of it ([`outcome`]). Pure.

pub mod decode;
pub mod headers;
pub mod outcome;

pub use decode::{decode, Job, Malformed};
pub use outcome::{Outcome, Reason};
