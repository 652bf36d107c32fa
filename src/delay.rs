//! Delay: how a refused job waits in RabbitMQ without a plugin, and the headers that
//! travel with it. Pure: names, routing keys and headers; the worker publishes.
//!
//! ## The ladder
//! Level `n` (0 ≤ n < levels) is a queue `<prefix>.<2^n>s` whose messages expire after
//! exactly 2^n seconds, and a topic exchange `<prefix>.x<n>`. A delay of D seconds is
//! written in binary as the routing key, one word per level from the highest down
//! (`0.0.1.0.1` is 5 s with 5 levels). Exchange `x<n>` sends a key whose word for
//! level n is `1` to queue `2^n s`, and a `0` on to exchange `x<n-1>`; each queue
//! dead-letters (keeping the key) to the next exchange down, and level 0 to the jobs
//! exchange. Every queue holds one TTL only, so a message never waits behind a longer
//! one (no head-of-line blocking), and a delay costs at most one hop per level.

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// Header: how many times the worker has handled this job, the handling that
/// published this copy included.
pub const ATTEMPT: &str = "x-notify-attempt";
/// Header: when the worker first saw this job (ms since the epoch).
pub const FIRST_SEEN: &str = "x-notify-first-seen";
/// Header: the instant the job waits for (ms since the epoch).
pub const NOT_BEFORE: &str = "x-notify-not-before";
/// Header on dead letters: the reason (`malformed`, `unknown_channel`, `capped`, `expired`).
pub const REASON: &str = "x-notify-reason";
/// Header on dead letters: a sentence for people.
pub const DETAIL: &str = "x-notify-detail";

/// The names of the delay ladder.
#[derive(Debug, Clone)]
pub struct Ladder {
    /// Name prefix.
    pub prefix: String,
    /// Number of levels.
    pub levels: u32,
}

impl Ladder {
    /// The exchange of level `n`.
    pub fn exchange(&self, n: u32) -> String {
        format!("{}.x{n}", self.prefix)
    }

    /// The queue of level `n`.
    pub fn queue(&self, n: u32) -> String {
        format!("{}.{}s", self.prefix, 1u64 << n)
    }

    /// Where a delayed job is published: the top level's exchange.
    pub fn entry(&self) -> String {
        self.exchange(self.levels - 1)
    }

    /// The longest delay one pass through the ladder holds, in seconds.
    pub fn max_seconds(&self) -> u64 {
        (1u64 << self.levels) - 1
    }

    /// Whole seconds to wait from `now` so that the job is back no earlier than
    /// `until`: rounded up, at least 1, at most [`Ladder::max_seconds`] (a longer wait
    /// comes back early, is checked again and waits again).
    pub fn seconds(&self, now: DateTime<Utc>, until: DateTime<Utc>) -> u64 {
        let ms = (until - now).num_milliseconds().max(1) as u64;
        ms.div_ceil(1000).clamp(1, self.max_seconds())
    }

    /// The routing key that spells `seconds` in binary, highest level first.
    pub fn routing_key(&self, seconds: u64) -> String {
        (0..self.levels)
            .rev()
            .map(|n| if seconds >> n & 1 == 1 { "1" } else { "0" })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The binding patterns of level `n`: (to its queue, on to the next level down).
    pub fn patterns(&self, n: u32) -> (String, String) {
        let skip = "*.".repeat((self.levels - 1 - n) as usize);
        (format!("{skip}1.#"), format!("{skip}0.#"))
    }
}

/// Headers for a job sent round again: the original headers without the broker's
/// `x-death` family (a message that carries them into a dead-letter cycle can be
/// dropped silently by the broker), the attempt count raised by one, the first-seen
/// time kept (or set to `now`), and the instant it waits for.
pub fn next_headers(
    original: Option<&FieldTable>,
    now: DateTime<Utc>,
    not_before: Option<DateTime<Utc>>,
) -> FieldTable {
    let mut out = FieldTable::default();
    let (attempt, first_seen) = attempt_info(original);
    if let Some(headers) = original {
        for (k, v) in headers.inner() {
            let k_str = k.as_str();
            if k_str == "x-death"
                || k_str.starts_with("x-first-death")
                || k_str.starts_with("x-last-death")
                || k_str == NOT_BEFORE
            {
                continue;
            }
            out.insert(k.clone(), v.clone());
        }
    }
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

/// (attempts so far, first-seen ms) from a job's headers.
pub fn attempt_info(headers: Option<&FieldTable>) -> (u64, Option<i64>) {
    let Some(h) = headers else { return (0, None) };
    let attempt = h.inner().get(ATTEMPT).and_then(as_i64).unwrap_or(0).max(0) as u64;
    let first = h.inner().get(FIRST_SEEN).and_then(as_i64);
    (attempt, first)
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
    let mut out = FieldTable::default();
    if let Some(headers) = original {
        for (k, v) in headers.inner() {
            let k_str = k.as_str();
            if k_str == "x-death"
                || k_str.starts_with("x-first-death")
                || k_str.starts_with("x-last-death")
            {
                continue;
            }
            out.insert(k.clone(), v.clone());
        }
    }
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
    use chrono::TimeZone;

    fn ladder() -> Ladder {
        Ladder {
            prefix: "notify.delay".into(),
            levels: 20,
        }
    }

    #[test]
    fn names() {
        let l = ladder();
        assert_eq!(l.queue(0), "notify.delay.1s");
        assert_eq!(l.queue(19), "notify.delay.524288s");
        assert_eq!(l.entry(), "notify.delay.x19");
        assert!(l.max_seconds() > 8 * 86_400);
    }

    #[test]
    fn the_key_spells_the_delay_and_each_level_routes_its_bit() {
        let l = Ladder {
            prefix: "d".into(),
            levels: 5,
        };
        assert_eq!(l.routing_key(5), "0.0.1.0.1");
        assert_eq!(l.patterns(4), ("1.#".into(), "0.#".into()));
        assert_eq!(l.patterns(0), ("*.*.*.*.1.#".into(), "*.*.*.*.0.#".into()));
        // every delay is the sum of the queues its key visits
        for secs in 1..=l.max_seconds() {
            let key = l.routing_key(secs);
            let total: u64 = key
                .split('.')
                .enumerate()
                .filter(|(_, w)| *w == "1")
                .map(|(i, _)| 1u64 << (l.levels as usize - 1 - i))
                .sum();
            assert_eq!(total, secs);
        }
    }

    #[test]
    fn seconds_round_up_and_clamp() {
        let l = ladder();
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(l.seconds(now, now), 1);
        assert_eq!(
            l.seconds(now, now + chrono::Duration::milliseconds(1001)),
            2
        );
        assert_eq!(l.seconds(now, now + chrono::Duration::seconds(5)), 5);
        assert_eq!(l.seconds(now, now + chrono::Duration::days(6)), 6 * 86_400);
        assert_eq!(
            l.seconds(now, now + chrono::Duration::days(60)),
            l.max_seconds()
        );
    }

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
}
