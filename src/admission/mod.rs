//! # The admission
//!
//! Whether a job may go now: its recipient's policy and the caps it meets, the
//! limits (`[limits.NAME]`) it takes from, its recipient's suppressions, opt-outs
//! and quiet hours, all checked and recorded in one atomic Redis call; then what
//! the worker does with the answer. Everything of it lives in this folder; read it
//! top to bottom, in the order a job meets it:
//!
//! 1. **The request** ([`request`]): what the worker asks ([`Request`], and how the
//!    channel's rate is taken with it, [`RateStep`]) and what it is answered
//!    ([`Admission`]; a granted one carries a [`Ticket`] for the commit or release).
//! 2. **The call** ([`admit`]): [`QuotaStore::admit`](crate::store::QuotaStore::admit)
//!    hands the request to the room's [`admit::Admit`] (which borrows the store),
//!    which turns it into the script's arguments (the policy's plan of the
//!    day, the caps' plans, cached per zone and local day by [`layers`]; the limits'
//!    buckets, a tenant's or sender's key made once and kept by [`state`]) and
//!    takes the channel's send rate with it.
//! 3. **The arguments** ([`command`]): the call's header, the plans, two arguments a
//!    job, then each optional section (suppressions, preferences, caps, limits).
//! 4. **The batch** ([`batch`]): admissions that wait at the same moment share one
//!    call (on a cluster, one per node), with `WAIT` after it when asked.
//! 5. **The script** (`src/admission/lua/`, joined in this order and registered
//!    with every other script in [`crate::redis::scripts`]): `protocol.lua` (the
//!    header's positions, the answers' codes and flags, by name), `plans.lua`,
//!    `limits.lua` (after the shared GCRA of `lua/gcra.lua`'s kind, in its own
//!    words; each bucket a call meets read and written once), `layers.lua`, `recipient.lua`, `suppression.lua`, `preferences.lua`,
//!    `answer.lua`.
//! 6. **The protocol** ([`protocol`]): each job's answer read by name into a
//!    [`protocol::Verdict`] whose variants are the script's codes, one name on
//!    both sides (`protocol/tests.rs` reads `lua/protocol.lua` and checks that both
//!    sides give each name the same number).
//! 7. **The answer settled** ([`admit`], [`quiet`]): a `replan` is asked again
//!    with the plan of Redis's own day; quiet hours that hold the job are computed
//!    and its caps looked at for their end.
//! 8. **The answer's meaning** ([`verdict`]): the settled verdict as the
//!    [`Admission`] it is for the job that was asked (the refusal's next allowed
//!    instant, the layer that holds it).
//! 9. **The decision** ([`decision`]): the admission, with the job's expiry, send
//!    windows and its policy's action, as the worker's
//!    [`Decision`](crate::decide::Decision): dispatch, wait, or dead-letter.
//!
//! Steps 8 and 9 are two because they read different things: the script's answer
//! is read once, into the [`Admission`] the store returns (what was asked, the
//! reservation's ticket, the refusal's instant), which a routed job's further
//! channels are asked for in turn; the decision then needs the job's route, its
//! expiry and windows, and whether a cancel or a pause came meanwhile, known only
//! after.
//!
//! Its state in this worker (the batched call, the reservations kept for failed
//! dispatches, the plans made, whether suppressions are checked) is its own
//! ([`state`]); the quota store holds it whole, and its call and settling are an
//! [`admit::Admit`]'s methods (`admit.rs`, `quiet.rs`), never the store's.
//!
//! The room spans floors of the layer table in `src/lib.rs`: the request, the
//! arguments and the protocol are pure (the domain); the decision is pure (with
//! [`crate::decide`]); the batch speaks to Redis; the call and the settling are the
//! quota store's.

pub(crate) mod admit;
pub(crate) mod batch;
pub(crate) mod command;
pub(crate) mod decision;
pub(crate) mod layers;
pub(crate) mod protocol;
pub(crate) mod quiet;
pub mod request;
pub(crate) mod state;
pub(crate) mod verdict;

pub(crate) use request::RateStep;
pub use request::{Admission, Request, Ticket};
