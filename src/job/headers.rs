//! The headers that travel with a job: the `x-notify-*` ones the worker writes
//! (attempts, first seen, the instant it waits for; reason and detail on a dead
//! letter), and what it strips before a job goes round again (the ladder's bits and
//! the broker's `x-death` family). Pure.

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use crate::amqp::ladder::BIT_PREFIX;

/// Header: how many times the worker has handled this job, the handling that
/// published this copy included.
pub const ATTEMPT: &str = "x-notify-attempt";
/// Header: when the worker first saw this job (ms since the epoch).
pub const FIRST_SEEN: &str = "x-notify-first-seen";
/// Header: the instant the job waits for (ms since the epoch).
pub const NOT_BEFORE: &str = "x-notify-not-before";
/// Header on dead letters: the reason (`malformed`, `unknown_channel`, `capped`, `expired`).
pub const REASON: &str = "x-notify-reason";
/// What holds a delayed job: a cap, send windows, its schedule (for people and
/// `admin`; the worker does not read it back).
pub(crate) const HELD_BY: &str = "x-notify-held-by";
/// Header on dead letters: a sentence for people.
pub const DETAIL: &str = "x-notify-detail";

fn internal(name: &str) -> bool {
    name == "x-death"
        || name.starts_with("x-first-death")
        || name.starts_with("x-last-death")
        || name.starts_with(BIT_PREFIX)
}

/// Headers for a job sent round again: the original headers without the ladder's
/// bits and the broker's `x-death` family (a message that carries them into a dead-letter cycle can be
/// dropped silently by the broker), the attempt count raised by one, the first-seen
/// time kept (or set to `now`), and the instant it waits for.
pub fn next_headers(
    original: Option<&FieldTable>,
    now: DateTime<Utc>,
    not_before: Option<DateTime<Utc>>,
) -> FieldTable {
    let mut out = own_headers(original);
    let (attempt, first_seen) = attempt_info(original);
    // saturating: the header comes from outside (a producer may set any value)
    out.insert(
        ATTEMPT.into(),
        AMQPValue::LongLongInt((attempt as i64).saturating_add(1)),
    );
    out.insert(
        FIRST_SEEN.into(),
        AMQPValue::LongLongInt(first_seen.unwrap_or(now.timestamp_millis())),
    );
    if let Some(t) = not_before {
        out.insert(
            NOT_BEFORE.into(),
            AMQPValue::LongLongInt(t.timestamp_millis()),
        );
    }
    out
}

/// Headers for a job's dispatch. A job the worker has handled before (it carries an
/// attempt count: it went round the ladder) gets [`next_headers`]: its attempt count
/// raised, its first-seen time kept. A job dispatched at its first handling keeps the
/// headers it came with, less the ladder's bits and the broker's `x-death` family, and
/// gets no `x-notify-*` header (they would say "attempt 1, first seen now"): every
/// header costs the broker on each message, and two cost RabbitMQ 3.10 about a quarter
/// more CPU per message in the benchmark's pass-through (BENCHMARKS.md). `None` when
/// no header is left.
pub(crate) fn dispatch_headers(
    original: Option<&FieldTable>,
    now: DateTime<Utc>,
) -> Option<FieldTable> {
    let headers = original?;
    if headers.inner().contains_key(ATTEMPT) {
        return Some(next_headers(original, now, None));
    }
    let out = own_headers(original);
    (!out.inner().is_empty()).then_some(out)
}

/// The headers a job carries of its own: all but the ladder's bits, its wait
/// instant and the broker's `x-death` family.
fn own_headers(original: Option<&FieldTable>) -> FieldTable {
    kept(original, |name| name != NOT_BEFORE && name != HELD_BY)
}

/// The headers of `original` that are neither the ladder's nor the broker's and
/// that `keep` keeps.
fn kept(original: Option<&FieldTable>, keep: impl Fn(&str) -> bool) -> FieldTable {
    let mut out = FieldTable::default();
    for (k, v) in original.into_iter().flat_map(|h| h.inner()) {
        if !internal(k.as_str()) && keep(k.as_str()) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// When the worker parked a job in its lane (ms of Redis time), for the lane wait.
pub const PARKED_AT: &str = "x-notify-parked-at";

/// Headers for a job parked in its lane: its own headers (the ladder's bits and the
/// broker's `x-death` family dropped; the attempt count kept as it is: parking is
/// no attempt), when it was parked, and when a worker first saw it: kept if it
/// says, else `first_seen`, earlier than the park when it waited in a line first
/// (an erase between the two drops it: `crate::erase::marks`).
pub fn parked_headers(
    original: Option<&FieldTable>,
    now: DateTime<Utc>,
    first_seen: DateTime<Utc>,
) -> FieldTable {
    let mut out = kept(original, |name| name != PARKED_AT);
    out.insert(
        PARKED_AT.into(),
        AMQPValue::LongLongInt(now.timestamp_millis()),
    );
    if !out.inner().contains_key(FIRST_SEEN) {
        out.insert(
            FIRST_SEEN.into(),
            AMQPValue::LongLongInt(first_seen.timestamp_millis()),
        );
    }
    out
}

/// (attempts so far, first-seen ms) from a job's headers.
pub fn attempt_info(headers: Option<&FieldTable>) -> (u64, Option<i64>) {
    let Some(h) = headers else { return (0, None) };
    let attempt = h.inner().get(ATTEMPT).and_then(as_i64).unwrap_or(0).max(0) as u64;
    let first = h.inner().get(FIRST_SEEN).and_then(as_i64);
    (attempt, first)
}

/// Name what holds a delayed job (`x-notify-held-by`), e.g. "policy `default` (at
/// most 1 per 1d)" or "the send windows of channel `sms`".
pub fn held_by(headers: &mut FieldTable, held_by: &str) {
    headers.insert(HELD_BY.into(), AMQPValue::LongString(held_by.into()));
}

/// Read an integer header whatever integer type the publisher used.
pub fn as_i64(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::ShortShortInt(x) => Some(*x as i64),
        AMQPValue::ShortShortUInt(x) => Some(*x as i64),
        AMQPValue::ShortInt(x) => Some(*x as i64),
        AMQPValue::ShortUInt(x) => Some(*x as i64),
        AMQPValue::LongInt(x) => Some(*x as i64),
        AMQPValue::LongUInt(x) => Some(*x as i64),
        AMQPValue::LongLongInt(x) => Some(*x),
        AMQPValue::Timestamp(x) => Some(*x as i64),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        _ => None,
    }
}

/// Read a string header.
pub fn as_string(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// Headers of a dead letter: the original ones (less `x-death`), plus reason and detail.
pub fn dead_headers(original: Option<&FieldTable>, reason: &str, detail: &str) -> FieldTable {
    let mut out = kept(original, |_| true);
    out.insert(
        ShortString::from(REASON),
        AMQPValue::LongString(reason.into()),
    );
    out.insert(
        ShortString::from(DETAIL),
        AMQPValue::LongString(detail.into()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::ladder::Ladder;
    use chrono::TimeZone;

    #[test]
    fn headers_drop_x_death_and_count_attempts() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::FieldArray(Default::default()));
        h.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("q".into()),
        );
        h.insert("trace".into(), AMQPValue::LongString("abc".into()));
        let first = next_headers(Some(&h), now, None);
        assert!(!first.contains_key("x-death") && !first.contains_key("x-first-death-queue"));
        assert!(first.contains_key("trace"));
        assert_eq!(
            attempt_info(Some(&first)),
            (1, Some(now.timestamp_millis()))
        );
        let later = now + chrono::Duration::hours(1);
        let second = next_headers(Some(&first), later, Some(later));
        assert_eq!(
            attempt_info(Some(&second)),
            (2, Some(now.timestamp_millis()))
        );
    }

    #[test]
    fn a_first_dispatch_carries_only_the_jobs_own_headers() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(dispatch_headers(None, now), None);
        // nothing of its own: no header table at all
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::FieldArray(Default::default()));
        h.insert(NOT_BEFORE.into(), AMQPValue::LongLongInt(1));
        let ladder = Ladder {
            prefix: "notify.delay".into(),
            levels: 20,
        };
        ladder.mark(&mut h, 3);
        assert_eq!(dispatch_headers(Some(&h), now), None);
        // the producer's own headers pass, and no x-notify-* is added
        h.insert("trace".into(), AMQPValue::LongString("abc".into()));
        let first = dispatch_headers(Some(&h), now).unwrap();
        assert_eq!(
            first.inner().keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["trace"]
        );
        assert_eq!(attempt_info(Some(&first)), (0, None));
        // a job back from the ladder gets its attempt count raised
        let back = next_headers(Some(&h), now, Some(now));
        let later = now + chrono::Duration::hours(1);
        let second = dispatch_headers(Some(&back), later).unwrap();
        assert_eq!(
            attempt_info(Some(&second)),
            (2, Some(now.timestamp_millis()))
        );
        assert!(second.contains_key("trace") && !second.contains_key(NOT_BEFORE));
    }

    #[test]
    fn a_job_sent_round_again_drops_the_bits_of_its_last_delay() {
        let l = Ladder {
            prefix: "d".into(),
            levels: 5,
        };
        let mut h = FieldTable::default();
        l.mark(&mut h, 7);
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert!(!next_headers(Some(&h), now, None)
            .inner()
            .keys()
            .any(|k| k.as_str().starts_with(BIT_PREFIX)));
        assert!(!dead_headers(Some(&h), "capped", "d")
            .inner()
            .keys()
            .any(|k| k.as_str().starts_with(BIT_PREFIX)));
    }
}
