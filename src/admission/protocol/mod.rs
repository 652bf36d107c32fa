//! What the admission's script answers, by name: the codes and flags of
//! `src/admission/lua/protocol.lua` as a Rust `enum` (a test reads the script and
//! checks that both sides name the same numbers), and each job's answer read into
//! a [`Verdict`], whose variants are named as the codes are. Pure: no I/O.

use crate::quota::suppression::Suppression;

/// An answer's code (`ANSWER` in `src/admission/lua/protocol.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i64)]
pub(crate) enum Code {
    Admitted = 1,
    Refused = 2,
    Shadowed = 3,
    Duplicate = 4,
    Reserved = 5,
    Replan = 6,
    WrongType = 7,
    Elsewhere = 8,
    Layered = 9,
    Suppressed = 10,
    OptedOut = 11,
    QuietHours = 12,
    Limited = 13,
}

impl Code {
    /// Every code, with its name in the script.
    pub(crate) const ALL: [(Code, &'static str); 13] = [
        (Code::Admitted, "admitted"),
        (Code::Refused, "refused"),
        (Code::Shadowed, "shadowed"),
        (Code::Duplicate, "duplicate"),
        (Code::Reserved, "reserved"),
        (Code::Replan, "replan"),
        (Code::WrongType, "wrong_type"),
        (Code::Elsewhere, "elsewhere"),
        (Code::Layered, "layered"),
        (Code::Suppressed, "suppressed"),
        (Code::OptedOut, "opted_out"),
        (Code::QuietHours, "quiet_hours"),
        (Code::Limited, "limited"),
    ];

    fn from_number(n: i64) -> Option<Code> {
        Code::ALL.iter().map(|(c, _)| *c).find(|c| *c as i64 == n)
    }
}

/// An answer's flags (`FLAG` in `src/admission/lua/protocol.lua`).
pub(crate) struct Flag;

impl Flag {
    /// Admitted or shadowed over its own abandoned reservation.
    pub(crate) const INHERITED: i64 = 1;
    /// Refused or layered, with the recipient's quiet hours' version after the flags.
    pub(crate) const QUIET: i64 = 2;
    /// Admitted or shadowed, and it took from its limits (the TATs its takes left
    /// are worked out from the reply's tail: `command::Numbering::replay`).
    pub(crate) const TAKEN: i64 = 4;
    /// Every flag, with its name in the script.
    #[cfg(test)]
    pub(crate) const ALL: [(i64, &'static str); 3] = [
        (Flag::INHERITED, "inherited"),
        (Flag::QUIET, "quiet"),
        (Flag::TAKEN, "taken"),
    ];
}

/// One job's answer from the admission's script; each carries the call's Redis time `now`
/// (ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Admitted and recorded at `now`; `true` when it took over its own abandoned
    /// reservation (whose dispatch may have gone out: see [`crate::admission::Ticket::inherited`]);
    /// the TAT (µs) each of its limits' takes left, in the order of its limits.
    Admitted(i64, bool, Vec<i64>),
    /// Refused; the times (ms) of the sends still remembered; the version of the
    /// recipient's quiet hours when they do not allow the job.
    Refused(i64, Vec<i64>, Option<i64>),
    /// A shadow policy's rules would refuse it; recorded at `now` all the same; the
    /// times (ms) of the other sends still remembered; inherited and the limits'
    /// takes as for `Admitted`.
    Shadowed(i64, Vec<i64>, bool, Vec<i64>),
    /// Already dispatched.
    Duplicate(i64),
    /// Another worker's live reservation, made at the second time (ms).
    Reserved(i64, i64),
    /// `now` is outside the day the plan was made for: plan again for `now`.
    Replan(i64),
    /// The recipient's key holds another type than a sorted set.
    WrongType(i64),
    /// The key is not on the node the call went to (a cluster's slots moved):
    /// nothing was written; ask again with the key declared.
    Elsewhere(i64),
    /// The recipient is suppressed on the job's channel by a kind its policy is
    /// held by.
    Suppressed(i64, Suppression),
    /// The recipient opted out: 1 its category, 2 its channel, 3 the pair.
    OptedOut(i64, i64),
    /// The recipient has quiet hours (of this version) to compute first.
    QuietHours(i64, i64),
    /// A job with layers, refused by its policy or a cap: the times (ms) of the
    /// sends each layer remembers, its policy's first, then each cap's in the order
    /// given (none for a cap that only counts); the quiet hours' version as for
    /// `Refused`.
    Layered(i64, Vec<Vec<i64>>, Option<i64>),
    /// Its policy and caps pass, a limit does not: nothing was written; the
    /// instant (ms) at which every refusing limit allows, and the index (from 0)
    /// among the job's limits of the one that allows last.
    Limited(i64, i64, usize),
}

impl Verdict {
    /// Redis time of the call.
    pub fn now(&self) -> i64 {
        match self {
            Verdict::Admitted(now, ..)
            | Verdict::Refused(now, ..)
            | Verdict::Shadowed(now, ..)
            | Verdict::Duplicate(now)
            | Verdict::Reserved(now, _)
            | Verdict::Replan(now)
            | Verdict::WrongType(now)
            | Verdict::Elsewhere(now)
            | Verdict::Suppressed(now, ..)
            | Verdict::OptedOut(now, _)
            | Verdict::QuietHours(now, _)
            | Verdict::Layered(now, ..)
            | Verdict::Limited(now, ..) => *now,
        }
    }
}

/// One answer as the reply lays it out: code, flags, the quiet hours' version
/// (when flagged), and the payload.
struct Answer<'a> {
    code: Code,
    flags: i64,
    quiet: Option<i64>,
    payload: &'a [i64],
}

/// The first answer of `rest`, and what follows it; `None` if it does not have
/// the answer's shape.
fn next_answer(rest: &[i64]) -> Option<(Answer<'_>, &[i64])> {
    let (&code, rest) = rest.split_first()?;
    let (&flags, mut rest) = rest.split_first()?;
    let quiet = match flags & Flag::QUIET {
        0 => None,
        _ => {
            let (&v, tail) = rest.split_first()?;
            rest = tail;
            Some(v)
        }
    };
    let (&n, rest) = rest.split_first()?;
    let n = usize::try_from(n).ok().filter(|n| *n <= rest.len())?;
    let answer = Answer {
        code: Code::from_number(code)?,
        flags,
        quiet,
        payload: &rest[..n],
    };
    Some((answer, &rest[n..]))
}

/// The blocks of a `layered` payload: n, then n blocks (m, t1 .. tm), exactly.
fn blocks(payload: &[i64]) -> Option<Vec<Vec<i64>>> {
    let (&n, mut rest) = payload.split_first()?;
    let mut out = Vec::with_capacity(usize::try_from(n).ok()?.min(64));
    for _ in 0..n {
        let (&m, tail) = rest.split_first()?;
        let m = usize::try_from(m).ok().filter(|m| *m <= tail.len())?;
        out.push(tail[..m].to_vec());
        rest = &tail[m..];
    }
    rest.is_empty().then_some(out)
}

impl Answer<'_> {
    /// The verdict this answer gives at `now`; `None` if its payload does not fit
    /// its code.
    fn verdict(&self, now: i64) -> Option<Verdict> {
        let p = self.payload;
        // a job that took is admitted or shadowed; its takes are filled in later
        let took = self.flags & Flag::TAKEN != 0;
        if took && !matches!(self.code, Code::Admitted | Code::Shadowed) {
            return None;
        }
        let inherited = self.flags & Flag::INHERITED != 0;
        let one = || match p {
            [v] => Some(*v),
            _ => None,
        };
        Some(match self.code {
            Code::Admitted => Verdict::Admitted(now, inherited, Vec::new()),
            Code::Refused => Verdict::Refused(now, p.to_vec(), self.quiet),
            Code::Shadowed => Verdict::Shadowed(now, p.to_vec(), inherited, Vec::new()),
            Code::Duplicate => Verdict::Duplicate(now),
            Code::Reserved => Verdict::Reserved(now, one()?),
            Code::Replan => Verdict::Replan(now),
            Code::WrongType => Verdict::WrongType(now),
            Code::Elsewhere => Verdict::Elsewhere(now),
            Code::Layered => Verdict::Layered(now, blocks(p)?, self.quiet),
            Code::Suppressed => match p {
                [kind, since, until] => {
                    Verdict::Suppressed(now, Suppression::from_parts(*kind, *since, *until)?)
                }
                _ => return None,
            },
            Code::OptedOut => Verdict::OptedOut(now, one()?),
            Code::QuietHours => Verdict::QuietHours(now, one()?),
            Code::Limited => match p {
                [at, which] if *which >= 1 => {
                    Verdict::Limited(now, *at, usize::try_from(*which - 1).ok()?)
                }
                _ => return None,
            },
        })
    }
}

/// The verdicts of `jobs` jobs from the script's flat reply: `now`, then each
/// job's answer, then the tail (the limits' bases and intervals, when the call
/// carries limits; the takes of an admitted or shadowed job are left empty, for
/// `command::Numbering::replay`). `None` if the reply does not have that shape.
pub fn verdicts(flat: &[i64], jobs: usize) -> Option<(Vec<Verdict>, &[i64])> {
    let (&now, mut rest) = flat.split_first()?;
    let mut out = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let (answer, tail) = next_answer(rest)?;
        out.push(answer.verdict(now)?);
        rest = tail;
    }
    Some((out, rest))
}

#[cfg(test)]
mod tests;
