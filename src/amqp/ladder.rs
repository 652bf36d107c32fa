//! The delay ladder: how a refused job waits in RabbitMQ without a plugin. Pure:
//! names, routing keys and the headers that spell a delay; the worker publishes.
//!
//! ## The ladder
//! Level `n` (0 ≤ n < levels) is a queue `<prefix>.<2^n>s` whose messages expire after
//! exactly 2^n seconds, and a headers exchange `<prefix>.x<n>`. A delay of D seconds
//! is written in binary as message headers `notify-delay-<n>: "1"`, one per set bit
//! below the highest. Exchange `x<n>` sends a message carrying bit n to queue `2^n s`;
//! any other message goes on to its alternate exchange `x<n-1>`. Each queue
//! dead-letters to the next exchange down, and level 0 (queue and alternate exchange)
//! to the jobs exchange. A delayed job is published straight to the queue of its
//! highest bit, so it never passes that bit's exchange and carries no header for it
//! (a header costs the broker and the worker each about a quarter of a microsecond,
//! BENCHMARKS.md item 24). Every queue holds
//! one TTL only, so a message never waits behind a longer one (no head-of-line
//! blocking), and a delay costs at most one hop per level. (A headers exchange with
//! one binding matches in constant time; a topic exchange would walk a trie of
//! `levels` words at every level, which made the broker the bottleneck.)

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable};

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

    /// Where a job delayed by `seconds` is published: straight to the queue of its
    /// highest bit (through the default exchange, so the broker routes nothing).
    pub fn entry(&self, seconds: u64) -> String {
        self.queue(Ladder::entry_level(seconds, self.levels))
    }

    /// The level of [`Ladder::entry`] in a ladder of `levels`.
    pub(crate) fn entry_level(seconds: u64, levels: u32) -> u32 {
        let top = 63 - seconds.max(1).leading_zeros();
        top.min(levels - 1)
    }

    /// The longest delay one pass through the ladder holds, in seconds.
    pub(crate) fn max_seconds(&self) -> u64 {
        (1u64 << self.levels) - 1
    }

    /// Whole seconds to wait from `now` so that the job is back no earlier than
    /// `until`: rounded up, at least 1, at most [`Ladder::max_seconds`] (a longer wait
    /// comes back early, is checked again and waits again).
    pub fn seconds(&self, now: DateTime<Utc>, until: DateTime<Utc>) -> u64 {
        let ms = (until - now).num_milliseconds().max(1) as u64;
        ms.div_ceil(1000).clamp(1, self.max_seconds())
    }

    /// The levels whose bit is set in `seconds`, highest first.
    pub fn bits(&self, seconds: u64) -> impl Iterator<Item = u32> {
        (0..self.levels)
            .rev()
            .filter(move |n| seconds >> n & 1 == 1)
    }

    /// The level whose queue holds a job delayed by `seconds`, `elapsed_ms` after it
    /// was published (it waits in each set bit's queue in turn, highest first);
    /// `None` once the delay is over (it is back in the jobs queue).
    pub(crate) fn level_at(&self, seconds: u64, elapsed_ms: i64) -> Option<u32> {
        let mut left = elapsed_ms.max(0);
        for n in self.bits(seconds) {
            let hold = 1000i64 << n;
            if left < hold {
                return Some(n);
            }
            left -= hold;
        }
        None
    }

    /// Add the headers that spell `seconds` to `headers`: one per set bit but the
    /// highest, whose queue is [`Ladder::entry`] (the job is published there, past
    /// that level's exchange).
    pub fn mark(&self, headers: &mut FieldTable, seconds: u64) {
        for n in self.bits(seconds).skip(1) {
            let name = BIT_HEADERS
                .get(n as usize)
                .copied()
                .map_or_else(|| bit_header(n), str::to_string);
            headers.insert(name.into(), AMQPValue::LongString("1".into()));
        }
    }

    /// The binding arguments of level `n`'s queue to its exchange.
    pub(crate) fn binding(&self, n: u32) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-match".into(), AMQPValue::LongString("all".into()));
        args.insert(bit_header(n).into(), AMQPValue::LongString("1".into()));
        args
    }
}

/// Prefix of the headers that spell a delay (no `x-`: headers exchanges ignore
/// binding arguments that start with it).
pub const BIT_PREFIX: &str = "notify-delay-";

fn bit_header(n: u32) -> String {
    format!("{BIT_PREFIX}{n}")
}

/// The names of the first 32 levels' headers, written out: a delay of a day sets
/// about eight bits, and formatting each name cost more than the rest of the delay
/// (BENCHMARKS.md item 16).
const BIT_HEADERS: [&str; 32] = [
    "notify-delay-0",
    "notify-delay-1",
    "notify-delay-2",
    "notify-delay-3",
    "notify-delay-4",
    "notify-delay-5",
    "notify-delay-6",
    "notify-delay-7",
    "notify-delay-8",
    "notify-delay-9",
    "notify-delay-10",
    "notify-delay-11",
    "notify-delay-12",
    "notify-delay-13",
    "notify-delay-14",
    "notify-delay-15",
    "notify-delay-16",
    "notify-delay-17",
    "notify-delay-18",
    "notify-delay-19",
    "notify-delay-20",
    "notify-delay-21",
    "notify-delay-22",
    "notify-delay-23",
    "notify-delay-24",
    "notify-delay-25",
    "notify-delay-26",
    "notify-delay-27",
    "notify-delay-28",
    "notify-delay-29",
    "notify-delay-30",
    "notify-delay-31",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_out_header_names_are_the_formatted_ones() {
        for (n, name) in BIT_HEADERS.iter().enumerate() {
            assert_eq!(*name, bit_header(n as u32));
        }
    }
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
        assert_eq!(l.entry(5), "notify.delay.4s");
        assert_eq!(l.entry(l.max_seconds()), "notify.delay.524288s");
        assert!(l.max_seconds() > 8 * 86_400);
    }

    #[test]
    fn the_headers_spell_the_delay_and_each_level_matches_its_bit() {
        let l = Ladder {
            prefix: "d".into(),
            levels: 5,
        };
        assert_eq!(l.bits(5).collect::<Vec<_>>(), vec![2, 0]);
        for secs in 1..=l.max_seconds() {
            let mut h = FieldTable::default();
            l.mark(&mut h, secs);
            // published to the entry queue, past its level's exchange: no header
            // spells that level
            let entry = Ladder::entry_level(secs, l.levels);
            assert!(!h.contains_key(bit_header(entry).as_str()));
            // the queues a message visits: the entry, then as the exchanges below
            // it route it
            let total: u64 = (1u64 << entry)
                + (0..entry)
                    .filter(|n| {
                        l.binding(*n)
                            .inner()
                            .iter()
                            .filter(|(k, _)| k.as_str() != "x-match")
                            .all(|(k, v)| h.inner().get(k.as_str()) == Some(v))
                    })
                    .map(|n| 1u64 << n)
                    .sum::<u64>();
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
}
