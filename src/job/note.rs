//! What the worker notes about a job when it delays it, dead-letters it, sends it
//! after a wait or finds it superseded: a [`JobNote`], kept in Redis for
//! `redis.record_ttl`, which `admin job ID` reads back. Pure: the record and what it
//! says about where the job is now ([`JobNote::place`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::amqp::ladder::Ladder;

/// The last thing a worker did with a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum JobState {
    /// Sent round the delay ladder.
    Delayed {
        /// When it comes back to be decided again.
        #[serde(with = "instant")]
        until: DateTime<Utc>,
        /// The delay in whole seconds (the ladder's bits).
        seconds: u64,
        /// What held it: `cap`, `window`, `schedule`, `in_flight`, `dispatch_refused`.
        cause: String,
        /// What held it, in words (the `x-notify-held-by` header).
        held_by: String,
        /// For a cap: the sends of the recipient it saw remembered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sends_seen: Option<usize>,
    },
    /// Published to the dead-letter queue.
    Dead {
        /// The `x-notify-reason`.
        reason: String,
        /// The `x-notify-detail`.
        detail: String,
    },
    /// Dispatched after it had waited.
    Dispatched,
    /// Acked unsent: a newer job with its collapse key replaced it.
    Superseded {
        /// The newer job's id.
        by: String,
    },
    /// Folded into a digest (its policy has one), sent with it.
    Folded {
        /// When the digest closes (as the fold saw it).
        #[serde(with = "instant")]
        closes_at: DateTime<Utc>,
        /// The digest's id.
        digest: String,
    },
}

/// A job's record: its last step, when, and what it was decided under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNote {
    /// What happened last.
    #[serde(flatten)]
    pub step: JobState,
    /// When the worker did it (Redis time).
    #[serde(with = "instant")]
    pub at: DateTime<Utc>,
    /// The times a worker handled it before.
    pub attempt: u64,
    /// When a worker first saw it.
    #[serde(with = "instant")]
    pub first_seen: DateTime<Utc>,
    /// Its policy (none for a job dead before one applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Its channel.
    pub channel: String,
    /// The zone it was decided in (its `timezone`, or the worker's default):
    /// `admin recipient` reads it from the recipient's waiting jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The trace of the handling that wrote it (hex), while tracing is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Its tenant, when it has one (the console's list of waiting jobs chooses by
    /// it; stored as an `n=` prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Where a job is, as far as its record tells.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "place", rename_all = "snake_case")]
pub enum Place {
    /// In a queue of the delay ladder (`queue`), until `until`.
    DelayQueue {
        /// The queue it sits in now (from when it entered and the ladder's TTLs).
        queue: String,
    },
    /// Back in the jobs queue: due since `since`, waiting for a worker.
    JobsQueue {
        /// When it came back.
        since: DateTime<Utc>,
    },
    /// In the dead-letter queue (unless replayed or purged since).
    Dead,
    /// Dispatched after it had waited.
    Dispatched,
    /// Acked unsent, replaced by a newer job.
    Superseded,
    /// In digest `digest`, sent with it when it closes, at `closes_at`.
    Digest {
        /// The digest's id.
        digest: String,
        /// When it closes (as the fold saw it).
        closes_at: DateTime<Utc>,
    },
    /// No record: never delayed nor dead-lettered (sent at its first handling, or
    /// still in the jobs queue for the first time), or its record has expired.
    Unknown,
}

impl JobNote {
    /// Where the job is at `now`, given the ladder it waits in.
    pub fn place(&self, ladder: &Ladder, now: DateTime<Utc>) -> Place {
        match &self.step {
            JobState::Delayed { seconds, .. } => {
                let elapsed = (now - self.at).num_milliseconds();
                match ladder.level_at(*seconds, elapsed) {
                    Some(n) => Place::DelayQueue {
                        queue: ladder.queue(n),
                    },
                    None => Place::JobsQueue {
                        since: self.at + chrono::Duration::seconds(*seconds as i64),
                    },
                }
            }
            JobState::Dead { .. } => Place::Dead,
            JobState::Dispatched => Place::Dispatched,
            JobState::Superseded { .. } => Place::Superseded,
            JobState::Folded { digest, closes_at } => Place::Digest {
                digest: digest.clone(),
                closes_at: *closes_at,
            },
        }
    }
}

/// The stored form of a record: one line of `|`-separated fields, instants in
/// milliseconds, the one free text of its step (what held it, the dead letter's
/// detail, the newer job's id) last and as it is:
///
/// ```text
/// r2|d|<at>|<attempt>|<first seen>|<policy>|<channel>|<zone>|<until>|<seconds>|<cause>|<sends seen>|<held by>
/// r2|x|<at>|<attempt>|<first seen>|<policy>|<channel>|<zone>|<reason>|<detail>
/// r2|s|<at>|<attempt>|<first seen>|<policy>|<channel>|<zone>
/// r2|c|<at>|<attempt>|<first seen>|<policy>|<channel>|<zone>|<by>
/// r2|f|<at>|<attempt>|<first seen>|<policy>|<channel>|<zone>|<closes at>|<digest>
/// ```
///
/// A record is written for every delayed job, so it is built by hand: serde_json's
/// writer cost more than the rest of the note, and the text was twice as long for
/// Redis to copy (BENCHMARKS.md item 20). `%` and `|` in the named fields are
/// written `%25` and `%7C`. A record written while tracing is on starts with
/// `t=<trace id>|`. [`JobNote::decode`] also reads what earlier versions
/// wrote: `r1|...` (the same without `<zone>`) and JSON.
impl JobNote {
    /// The record as stored.
    pub fn encode(&self) -> Vec<u8> {
        let free = match &self.step {
            JobState::Delayed { held_by, .. } => held_by.len(),
            JobState::Dead { detail, .. } => detail.len() + 16,
            JobState::Superseded { by } => by.len(),
            JobState::Folded { digest, .. } => digest.len() + 16,
            JobState::Dispatched => 0,
        };
        let zone = self.zone.as_deref().unwrap_or("");
        let mut out = Vec::with_capacity(96 + free + self.channel.len() + zone.len());
        self.prefixes(&mut out);
        let mut num = itoa::Buffer::new();
        let state: &[u8] = match self.step {
            JobState::Delayed { .. } => b"r2|d|",
            JobState::Dead { .. } => b"r2|x|",
            JobState::Dispatched => b"r2|s|",
            JobState::Superseded { .. } => b"r2|c|",
            JobState::Folded { .. } => b"r2|f|",
        };
        out.extend_from_slice(state);
        out.extend_from_slice(num.format(self.at.timestamp_millis()).as_bytes());
        out.push(b'|');
        out.extend_from_slice(num.format(self.attempt).as_bytes());
        out.push(b'|');
        out.extend_from_slice(num.format(self.first_seen.timestamp_millis()).as_bytes());
        out.push(b'|');
        escape(&mut out, self.policy.as_deref().unwrap_or(""));
        out.push(b'|');
        escape(&mut out, &self.channel);
        out.push(b'|');
        escape(&mut out, zone);
        match &self.step {
            JobState::Delayed {
                until,
                seconds,
                cause,
                held_by,
                sends_seen,
            } => {
                out.push(b'|');
                out.extend_from_slice(num.format(until.timestamp_millis()).as_bytes());
                out.push(b'|');
                out.extend_from_slice(num.format(*seconds).as_bytes());
                out.push(b'|');
                escape(&mut out, cause);
                out.push(b'|');
                if let Some(n) = sends_seen {
                    out.extend_from_slice(num.format(*n).as_bytes());
                }
                out.push(b'|');
                out.extend_from_slice(held_by.as_bytes());
            }
            JobState::Dead { reason, detail } => {
                out.push(b'|');
                escape(&mut out, reason);
                out.push(b'|');
                out.extend_from_slice(detail.as_bytes());
            }
            JobState::Dispatched => {}
            JobState::Superseded { by } => {
                out.push(b'|');
                out.extend_from_slice(by.as_bytes());
            }
            JobState::Folded { closes_at, digest } => {
                out.push(b'|');
                out.extend_from_slice(num.format(closes_at.timestamp_millis()).as_bytes());
                out.push(b'|');
                out.extend_from_slice(digest.as_bytes());
            }
        }
        out
    }

    /// The optional prefixes of the stored form: the trace (`t=`), the tenant (`n=`).
    fn prefixes(&self, out: &mut Vec<u8>) {
        for (mark, value) in [(b"t=", &self.trace_id), (b"n=", &self.tenant)] {
            if let Some(v) = value {
                out.extend_from_slice(mark);
                escape(out, v);
                out.push(b'|');
            }
        }
    }

    /// A stored record, in the form [`JobNote::encode`] writes or the JSON form of
    /// earlier versions; `None` if it is neither.
    pub fn decode(text: &str) -> Option<JobNote> {
        if let Some(rest) = text.strip_prefix("t=") {
            let (trace_id, rest) = rest.split_once('|')?;
            let mut note = Self::decode(rest)?;
            note.trace_id = Some(unescape(trace_id));
            return Some(note);
        }
        if let Some(rest) = text.strip_prefix("n=") {
            let (tenant, rest) = rest.split_once('|')?;
            let mut note = Self::decode(rest)?;
            note.tenant = Some(unescape(tenant));
            return Some(note);
        }
        if text.starts_with('{') {
            return serde_json::from_str(text).ok();
        }
        let (zoned, rest) = match text.strip_prefix("r2|") {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix("r1|")?),
        };
        let (state, rest) = rest.split_once('|')?;
        let extra = match state {
            "d" => 5,
            "x" => 2,
            "s" => 0,
            "c" => 1,
            "f" => 2,
            _ => return None,
        };
        let mut f = rest.splitn(5 + usize::from(zoned) + extra, '|');
        let mut next = || f.next();
        let at = millis(next()?)?;
        let attempt = next()?.parse().ok()?;
        let first_seen = millis(next()?)?;
        let policy = Some(unescape(next()?)).filter(|p| !p.is_empty());
        let channel = unescape(next()?);
        let zone = match zoned {
            true => Some(unescape(next()?)).filter(|z| !z.is_empty()),
            false => None,
        };
        let step = match state {
            "d" => JobState::Delayed {
                until: millis(next()?)?,
                seconds: next()?.parse().ok()?,
                cause: unescape(next()?),
                sends_seen: match next()? {
                    "" => None,
                    n => Some(n.parse().ok()?),
                },
                held_by: next()?.to_string(),
            },
            "x" => JobState::Dead {
                reason: unescape(next()?),
                detail: next()?.to_string(),
            },
            "s" => JobState::Dispatched,
            "f" => JobState::Folded {
                closes_at: millis(next()?)?,
                digest: next()?.to_string(),
            },
            _ => JobState::Superseded {
                by: next()?.to_string(),
            },
        };
        Some(JobNote {
            step,
            at,
            attempt,
            first_seen,
            policy,
            channel,
            zone,
            trace_id: None,
            tenant: None,
        })
    }
}

fn millis(text: &str) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(text.parse().ok()?)
}

/// `text` with `%` and `|` written `%25` and `%7C`.
fn escape(out: &mut Vec<u8>, text: &str) {
    if !text.contains(['%', '|']) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    for b in text.bytes() {
        match b {
            b'%' => out.extend_from_slice(b"%25"),
            b'|' => out.extend_from_slice(b"%7C"),
            _ => out.push(b),
        }
    }
}

fn unescape(text: &str) -> String {
    if !text.contains('%') {
        return text.to_string();
    }
    text.replace("%7C", "|").replace("%25", "%")
}

/// An instant as RFC 3339 in UTC to the millisecond (`2026-11-25T07:00:00.123Z`),
/// written digit by digit: a note is written for every delayed job, and chrono's
/// general formatter cost more than the rest of the note (BENCHMARKS.md item 16).
/// Read back by chrono.
mod instant {
    use chrono::{DateTime, Datelike, Timelike, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        if !(0..=9999).contains(&t.year()) {
            return s.collect_str(&t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        }
        let mut b = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut v: u32| {
            for i in (at..at + width).rev() {
                b[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, 4, t.year() as u32);
        put(5, 2, t.month());
        put(8, 2, t.day());
        put(11, 2, t.hour());
        put(14, 2, t.minute());
        put(17, 2, t.second());
        put(20, 3, t.timestamp_subsec_millis().min(999));
        s.serialize_str(std::str::from_utf8(&b).expect("ASCII digits"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_written_as_chrono_writes_them_to_the_millisecond() {
        #[derive(Serialize, Deserialize)]
        struct T(#[serde(with = "instant")] DateTime<Utc>);
        for ms in [0i64, 1, 999, 1_764_547_200_123, 253_402_300_799_999, -1] {
            let t = crate::quota::window::from_millis(ms);
            let text = serde_json::to_string(&T(t)).unwrap();
            let chrono = t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            assert_eq!(text, format!("\"{chrono}\""));
            assert_eq!(serde_json::from_str::<T>(&text).unwrap().0, t);
        }
    }
    use chrono::TimeZone;

    fn delayed(seconds: u64) -> JobNote {
        let at = Utc.with_ymd_and_hms(2026, 11, 25, 12, 0, 0).unwrap();
        JobNote {
            step: JobState::Delayed {
                until: at + chrono::Duration::seconds(seconds as i64),
                seconds,
                cause: "cap".into(),
                held_by: "policy `default` (at most 1 per 1d)".into(),
                sends_seen: Some(1),
            },
            at,
            attempt: 0,
            first_seen: at,
            policy: Some("default".into()),
            channel: "sms".into(),
            zone: Some("Asia/Shanghai".into()),
            trace_id: None,
            tenant: None,
        }
    }

    #[test]
    fn a_delayed_job_walks_down_the_ladder_then_is_due() {
        let ladder = Ladder {
            prefix: "d".into(),
            levels: 3,
        };
        let r = delayed(7);
        let at = |ms: i64| r.place(&ladder, r.at + chrono::Duration::milliseconds(ms));
        let queue = |q: &str| Place::DelayQueue { queue: q.into() };
        // 7 s = 4 s, then 2 s, then 1 s
        assert_eq!(at(0), queue("d.4s"));
        assert_eq!(at(3_999), queue("d.4s"));
        assert_eq!(at(4_000), queue("d.2s"));
        assert_eq!(at(6_500), queue("d.1s"));
        assert_eq!(
            at(7_000),
            Place::JobsQueue {
                since: r.at + chrono::Duration::seconds(7)
            }
        );
    }

    #[test]
    fn every_step_round_trips_through_the_stored_form() {
        let r = delayed(5);
        let text = String::from_utf8(r.encode()).unwrap();
        assert_eq!(
            text,
            "r2|d|1795608000000|0|1795608000000|default|sms|Asia/Shanghai|1795608005000|5|cap|1|policy `default` (at most 1 per 1d)"
        );
        // what the previous version wrote: no zone
        let r1 = "r1|d|1795608000000|0|1795608000000|default|sms|1795608005000|5|cap|1|policy `default` (at most 1 per 1d)";
        assert_eq!(
            JobNote::decode(r1),
            Some(JobNote {
                zone: None,
                ..r.clone()
            })
        );
        let odd = |step| JobNote {
            step,
            policy: Some("a|b%7C".into()),
            channel: "sms|%".into(),
            ..delayed(5)
        };
        let steps = [
            r.step.clone(),
            JobState::Delayed {
                until: r.at,
                seconds: 1,
                cause: "window".into(),
                held_by: "window | with | bars %".into(),
                sends_seen: None,
            },
            JobState::Dead {
                reason: "capped".into(),
                detail: "earliest 2026-12-01T00:00:00Z | later than max_wait".into(),
            },
            JobState::Dispatched,
            JobState::Superseded {
                by: "id|with|bars".into(),
            },
            JobState::Folded {
                closes_at: r.at + chrono::Duration::minutes(15),
                digest: "dg-Xb3k9QmZtR2w-1795608000000-1".into(),
            },
        ];
        for step in steps {
            for rec in [
                odd(step.clone()),
                JobNote {
                    step: step.clone(),
                    policy: None,
                    zone: None,
                    ..r.clone()
                },
                JobNote {
                    step: step.clone(),
                    trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                    ..r.clone()
                },
                JobNote {
                    step: step.clone(),
                    tenant: Some("acme|%".into()),
                    ..r.clone()
                },
                JobNote {
                    step: step.clone(),
                    trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                    tenant: Some("acme".into()),
                    ..r.clone()
                },
            ] {
                let text = String::from_utf8(rec.encode()).unwrap();
                assert_eq!(JobNote::decode(&text), Some(rec), "{text}");
            }
        }
        assert_eq!(JobNote::decode("r1|q|1|0|1||sms"), None);
        assert_eq!(JobNote::decode("r1|d|1|0|1||sms|2"), None);
        assert_eq!(JobNote::decode("garbage"), None);
    }

    #[test]
    fn records_round_trip_through_json() {
        let r = delayed(5);
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""state":"delayed""#), "{text}");
        assert_eq!(serde_json::from_str::<JobNote>(&text).unwrap(), r);
        let dead = JobNote {
            step: JobState::Dead {
                reason: "cancelled".into(),
                detail: "cancelled".into(),
            },
            policy: None,
            ..r
        };
        let text = serde_json::to_string(&dead).unwrap();
        assert!(!text.contains("policy"), "{text}");
        assert_eq!(serde_json::from_str::<JobNote>(&text).unwrap(), dead);
        // what earlier versions stored is still read
        assert_eq!(JobNote::decode(&text), Some(dead));
    }
}
