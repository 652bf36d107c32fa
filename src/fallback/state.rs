//! The state of a routed job's step while it may still move on: written before the
//! step's dispatch, claimed when the sender reports the step `failed` or when its
//! escalation comes back, and ended by the first claim or by an answer. One string
//! in the recipient's hash slot (`Keys::route`), kept as long as the step may
//! still move on:
//!
//! - its first byte says where the step is: `P` pending, `A` answered (a delivery
//!   or a read came; written by `lua/feedback.lua` in the same script as the
//!   feedback's mark), `F` or `E` moved on by a failure or by its escalation
//!   (`lua/route_claim.lua`);
//! - its second byte says what answers it: `d` a delivery or a read, `r` a read
//!   alone, `-` nothing (its policy does not escalate);
//! - then the step it moves on to, its policy, the channel it leaves and the
//!   next, and the job's body.
//!
//! It is written once (`SET NX`): a job handled again after a crash finds it as
//! it was. A failure and an escalation racing each other move the step on once:
//! the first claim wins and the other way finds it claimed. The same way claiming
//! again (a feedback or escalation handled again after a crash) moves it on again,
//! and the next step's admission finds the first copy's send and answers
//! `duplicate`, so the step goes out once.

use crate::redis::StoreError;
use crate::store::QuotaStore;

/// Where a routed step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It may still move on.
    Pending,
    /// A delivery or a read answered it: it does not move on.
    Answered,
    /// It moved on, by the way this letter names (`F` a failure, `E` its
    /// escalation).
    MovedOn(u8),
}

/// The way a step moves on ([`claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The sender reported it `failed`.
    Failure,
    /// Its escalation came back unanswered.
    Escalation,
}

impl Way {
    fn letter(self) -> &'static str {
        match self {
            Way::Failure => "F",
            Way::Escalation => "E",
        }
    }
}

/// What answers a step (none: its policy does not escalate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answers {
    /// Nothing: only a failure moves it on.
    Nothing,
    /// A delivery or a read.
    Delivery,
    /// A read alone.
    Read,
}

/// What a routed job's next step needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextStep {
    /// The step it resumes at (1 is the first channel of `fallback`).
    pub step: usize,
    /// Its policy, for the count.
    pub policy: String,
    /// The channel it leaves.
    pub from: String,
    /// The channel it moves on to.
    pub to: String,
    /// The job's body, untouched.
    pub body: Vec<u8>,
}

/// A step's state as read: where it is, and its next step while pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Where it is.
    pub status: Status,
    /// Its next step (pending only).
    pub next: Option<NextStep>,
}

impl NextStep {
    fn encode(&self, answers: Answers) -> Vec<u8> {
        let by = match answers {
            Answers::Nothing => '-',
            Answers::Delivery => 'd',
            Answers::Read => 'r',
        };
        let head = format!(
            "P{by}{}|{}|{}|{}\n",
            self.step, self.policy, self.from, self.to
        );
        let mut out = Vec::with_capacity(head.len() + self.body.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    fn decode(value: &[u8]) -> Option<NextStep> {
        let cut = value.iter().position(|b| *b == b'\n')?;
        let head = std::str::from_utf8(value.get(2..cut)?).ok()?;
        let mut parts = head.splitn(4, '|');
        Some(NextStep {
            step: parts.next()?.parse().ok()?,
            policy: parts.next()?.to_string(),
            from: parts.next()?.to_string(),
            to: parts.next()?.to_string(),
            body: value[cut + 1..].to_vec(),
        })
    }
}

impl Kept {
    /// A state as stored (`None`: a value no worker writes).
    fn decode(value: &[u8]) -> Option<Kept> {
        Some(match value.first()? {
            b'P' => Kept {
                status: Status::Pending,
                next: Some(NextStep::decode(value)?),
            },
            b'A' => Kept {
                status: Status::Answered,
                next: None,
            },
            way @ (b'F' | b'E') => Kept {
                status: Status::MovedOn(*way),
                next: None,
            },
            _ => return None,
        })
    }
}

/// One step of a job: its tenant, recipient, id and the channel it went out on.
#[derive(Debug, Clone, Copy)]
pub struct StepOf<'a> {
    /// The job's tenant.
    pub tenant: Option<&'a str>,
    /// The job's recipient.
    pub recipient: &'a str,
    /// The job's id.
    pub id: &'a str,
    /// The channel the step went out on.
    pub channel: &'a str,
}

fn key(store: &QuotaStore, of: StepOf<'_>) -> String {
    store
        .keys()
        .for_tenant(of.tenant)
        .route(of.recipient, of.id, of.channel)
}

/// Keep `next` pending after the step `of` (whose channel is `next.from`) for
/// `ttl_ms`, unless a state is kept already (a job handled again after a crash).
pub async fn keep(
    store: &QuotaStore,
    of: StepOf<'_>,
    next: &NextStep,
    answers: Answers,
    ttl_ms: u64,
) -> Result<(), StoreError> {
    let mut conn = store.connection();
    let _: Option<String> = redis::cmd("SET")
        .arg(key(store, of))
        .arg(next.encode(answers))
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms.max(1))
        .query_async(&mut conn)
        .await?;
    Ok(())
}

/// The claim script's answers (`CLAIM` in `lua/route_claim.lua`; a test checks that
/// both sides name the same numbers).
struct Claim;

impl Claim {
    const NONE: i64 = 0;
    const OURS: i64 = 1;
    const THEIRS: i64 = 2;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 3] = [
        (Claim::NONE, "none"),
        (Claim::OURS, "ours"),
        (Claim::THEIRS, "theirs"),
    ];
}

/// Claim the move of the step `of` to its next step, for `way`: the next step
/// when the claim is this way's (it was pending, or this way claimed it before),
/// else where the step is (`None`: no state kept).
pub async fn claim(
    store: &QuotaStore,
    of: StepOf<'_>,
    way: Way,
) -> Result<Result<NextStep, Option<Status>>, StoreError> {
    let mut conn = store.connection();
    let (code, value): (i64, Vec<u8>) = store
        .scripts()
        .route_claim
        .key(key(store, of))
        .arg(way.letter())
        .invoke_async(&mut conn)
        .await?;
    let kept = match code {
        Claim::NONE => None,
        Claim::OURS | Claim::THEIRS => Kept::decode(&value),
        _ => {
            return Err(StoreError::Reply {
                script: "route_claim.lua",
                reply: vec![code],
            })
        }
    };
    Ok(match kept {
        Some(Kept {
            next: Some(next), ..
        }) => Ok(next),
        Some(k) => Err(Some(k.status)),
        None => Err(None),
    })
}

#[cfg(test)]
mod tests {
    use super::{Answers, Claim, Kept, NextStep, Status};
    use crate::redis::lua_tables::speaks_by_name;

    /// The claim script and [`Claim`] name the same answers by the same numbers,
    /// and the script answers by name.
    #[test]
    fn the_claim_script_and_its_reader_name_the_same_answers() {
        const LUA: &str = include_str!("../../lua/route_claim.lua");
        speaks_by_name("route_claim.lua", LUA, "CLAIM", &Claim::ALL);
    }

    #[test]
    fn a_kept_step_reads_back_as_written() {
        let n = NextStep {
            step: 2,
            policy: "security".into(),
            from: "email".into(),
            to: "sms".into(),
            body: b"{\"id\":\"a\"}\n|x".to_vec(),
        };
        let kept = Kept::decode(&n.encode(Answers::Read)).unwrap();
        assert_eq!(kept.status, Status::Pending);
        assert_eq!(kept.next, Some(n));
        assert_eq!(Kept::decode(b"A").map(|k| k.status), Some(Status::Answered));
        assert_eq!(
            Kept::decode(b"E").map(|k| k.status),
            Some(Status::MovedOn(b'E'))
        );
        assert_eq!(Kept::decode(b"no head"), None);
        assert_eq!(Kept::decode(b""), None);
    }
}
