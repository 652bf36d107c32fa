//! Which dead letters an operator means: the one predicate ([`Filter::matches`])
//! that the console's list and count (through the index's field sets, which hold
//! the same fields), its replay and purge, and `admin dead` apply alike; what a
//! dead letter says of its job for it ([`known`]: the body decoded with the rules
//! in force); and the print that names one dead letter in the queue and in the
//! dead-letter log alike ([`print`]), so that an action touches exactly the
//! letters it listed. Pure.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lapin::BasicProperties;

use super::dead_index::{Entry, Known};
use crate::config::Settings;
use crate::job::{decode, headers};
use crate::store::QuotaStore;

/// Which dead letters: every field given must match; `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this reason.
    pub reason: Option<String>,
    /// Only this policy.
    pub policy: Option<String>,
    /// Only this channel.
    pub channel: Option<String>,
    /// Only this recipient tag (of its tenant).
    pub recipient_tag: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this job id.
    pub id: Option<String>,
    /// Only those dead-lettered at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant.
    pub until: Option<DateTime<Utc>>,
}

impl Filter {
    /// Whether `e` is selected.
    pub fn matches(&self, e: &Entry) -> bool {
        let is = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        self.reason.as_ref().is_none_or(|r| *r == e.reason)
            && is(&self.policy, &e.policy)
            && is(&self.channel, &e.channel)
            && is(&self.recipient_tag, &e.recipient_tag)
            && is(&self.tenant, &e.tenant)
            && is(&self.id, &e.id)
            // (in whole milliseconds, as the index scores them)
            && self.since.is_none_or(|s| ms(e.at) >= ms(s))
            && self.until.is_none_or(|u| ms(e.at) < ms(u))
    }

    /// Whether it selects every dead letter.
    pub fn is_everything(&self) -> bool {
        *self == Filter::default()
    }

    /// The filter in words, for a confirmation: "reason `capped` and tenant `acme`".
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = [
            ("reason", &self.reason),
            ("policy", &self.policy),
            ("channel", &self.channel),
            ("recipient tag", &self.recipient_tag),
            ("tenant", &self.tenant),
            ("job id", &self.id),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some(format!("{name} `{}`", v.as_ref()?)))
        .collect();
        if let Some(s) = self.since {
            parts.push(format!("since {}", s.to_rfc3339()));
        }
        if let Some(u) = self.until {
            parts.push(format!("before {}", u.to_rfc3339()));
        }
        if parts.is_empty() {
            "every dead letter".into()
        } else {
            parts.join(" and ")
        }
    }
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// What a dead letter's body says of its job, decoded with the rules in force in
/// `store` and the worker's settings (nothing for a body that does not decode).
pub fn known(body: &[u8], store: &QuotaStore, settings: &Settings) -> Known {
    let (rules, keys) = (store.rules(), store.keys());
    let w = &settings.worker;
    match decode::decode(body, w.max_body_bytes, w.default_timezone) {
        Ok(job) => {
            let tenant = job.tenant.as_deref();
            Known {
                policy: Some(rules.policy_of(&job.category, tenant).name.clone()),
                channel: Some(job.channel.to_string()),
                recipient_tag: Some(keys.for_tenant(tenant).recipient_tag(&job.recipient)),
                tenant: tenant.map(str::to_string),
            }
        }
        Err(_) => Known::default(),
    }
}

/// The print of a dead letter: a hash of its body and of what the broker keeps
/// alike in the dead-letter queue and in the log (its id, timestamp, the worker's
/// reason, detail and attempt headers, the broker's first death), leaving out what
/// differs between the two copies or from one walk to the next (`x-death`,
/// `x-delivery-count`, `x-stream-offset`). Two dead letters with one print are
/// the same bytes with the same story: either stands for the other.
pub fn print(props: &BasicProperties, body: &[u8]) -> String {
    let headers = props.headers().as_ref();
    let text = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(headers::as_string)
    };
    let number = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(headers::as_i64)
    };
    let story = serde_json::json!([
        props.message_id().as_ref().map(|s| s.as_str()),
        props.timestamp(),
        text(headers::REASON),
        text(headers::DETAIL),
        number(headers::ATTEMPT),
        number(headers::FIRST_SEEN),
        text("x-first-death-reason"),
        text("x-first-death-queue"),
        text("x-first-death-exchange"),
    ]);
    let mut hasher = blake3::Hasher::new();
    hasher.update(story.to_string().as_bytes());
    hasher.update(&[0]);
    hasher.update(body);
    hasher.finalize().to_hex()[..32].to_string()
}

/// A set of dead letters by their prints, each as many times as it was listed:
/// what an action may still touch.
#[derive(Debug, Clone, Default)]
pub struct Prints(HashMap<String, u32>);

impl Prints {
    /// The prints of `entries`.
    pub fn of<'a>(prints: impl IntoIterator<Item = &'a str>) -> Self {
        let mut set = HashMap::new();
        for p in prints {
            *set.entry(p.to_string()).or_insert(0) += 1;
        }
        Prints(set)
    }

    /// Take one letter of print `p` out of the set: whether it was there.
    pub fn take(&mut self, p: &str) -> bool {
        match self.0.get_mut(p) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// How many are left untaken.
    pub fn left(&self) -> u32 {
        self.0.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable};

    fn letter(reason: &str, extra: Option<(&str, AMQPValue)>) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(headers::REASON.into(), AMQPValue::LongString(reason.into()));
        if let Some((k, v)) = extra {
            h.insert(k.into(), v);
        }
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn a_print_ignores_what_the_broker_adds_per_copy_and_sees_the_rest() {
        let plain = print(&letter("capped", None), b"{}");
        let counted = letter("capped", Some(("x-delivery-count", AMQPValue::LongInt(3))));
        assert_eq!(print(&counted, b"{}"), plain);
        let offset = letter(
            "capped",
            Some(("x-stream-offset", AMQPValue::LongLongInt(9))),
        );
        assert_eq!(print(&offset, b"{}"), plain);
        assert_ne!(print(&letter("expired", None), b"{}"), plain);
        assert_ne!(print(&letter("capped", None), b"{ }"), plain);
        let short = letter(
            "capped",
            Some((headers::ATTEMPT, AMQPValue::ShortShortInt(2))),
        );
        let long = letter(
            "capped",
            Some((headers::ATTEMPT, AMQPValue::LongLongInt(2))),
        );
        assert_eq!(print(&short, b"{}"), print(&long, b"{}"));
    }

    #[test]
    fn prints_are_taken_as_many_times_as_listed() {
        let mut set = Prints::of(["a", "a", "b"]);
        assert!(set.take("a") && set.take("a") && !set.take("a"));
        assert!(!set.take("c"));
        assert_eq!(set.left(), 1);
    }
}
