//! The digests' scripts, a module each: `lua/digest_fold.lua` ([`fold`]: a job into
//! its group's open digest), `lua/digest_claim.lua` ([`claim`]: the digests due,
//! each for a lease), `lua/digest_close.lua` ([`close`]: no more items, read them;
//! or not yet: a sliding digest) and `lua/digest_reopen.lua` ([`reopen`]: a held
//! digest refused when it went, open again); their arguments and replies; and the
//! plain commands around them ([`index`]: the index of close instants, the end of
//! a digest). What they mean is decided in the digests' room ([`crate::digest`]).

pub mod claim;
pub mod close;
pub mod fold;
pub mod index;
pub mod reopen;
