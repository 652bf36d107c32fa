//! The lanes (`[lanes]`, and `reserve` and `normal_share` of each paced channel):
//! where jobs that wait for their channel's rate are parked, by priority, and how
//! the lanes share the rate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::channels::ChannelSettings;
use super::error::{invalid, ConfigError};
use super::text::Dur;

/// Lane settings (`[lanes]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LaneSettings {
    /// Direct exchange a producer that knows a job's lane may publish it to, routing
    /// key `<channel>.<priority>` (default `notify.lanes`); a channel with no lanes
    /// (not paced) gets it through the alternate exchange, `amqp.jobs_exchange`.
    pub exchange: String,
    /// Every paced channel has a queue per lane, `<queue_prefix><channel>.<priority>`
    /// (default `notify.lanes.`).
    pub queue_prefix: String,
    /// The most deliveries the worker takes from each lane queue at once: `"auto"`
    /// (the default: at most [`crate::lanes::prefetch::AUTO_CEILING`]) or a number
    /// (1 to 65535). Under it, the worker holds what its channel's rate needs,
    /// measured as it runs.
    pub prefetch: LanePrefetch,
    /// A job read from the jobs queue whose channel's rate would make it wait at
    /// most this long waits in the worker; only a longer wait parks it in its lane
    /// (default 250ms; at most 10s). A burst above the rate for a moment (a producer
    /// publishing in batches) then costs no park, while a backlog behind the rate
    /// (waits growing past it) is parked and read out urgent first. The wait is
    /// what the rate answers, not the time Redis takes to answer.
    pub park_after: Dur,
}

/// `lanes.prefetch`: `"auto"` or a number of deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LanePrefetch {
    /// Up to [`crate::lanes::prefetch::AUTO_CEILING`].
    #[default]
    Auto,
    /// Up to this many.
    Max(u16),
}

impl LanePrefetch {
    /// The most deliveries held from one lane queue.
    pub fn ceiling(self) -> u16 {
        match self {
            LanePrefetch::Auto => crate::lanes::prefetch::AUTO_CEILING,
            LanePrefetch::Max(n) => n,
        }
    }
}

impl<'de> Deserialize<'de> for LanePrefetch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = LanePrefetch;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"auto\" or a number of deliveries from 1 to 65535")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<LanePrefetch, E> {
                u16::try_from(n).map(LanePrefetch::Max).map_err(|_| {
                    E::custom(format!(
                        "{n} is not \"auto\" nor a number of deliveries from 1 to 65535"
                    ))
                })
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<LanePrefetch, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "{n} is not \"auto\" nor a number of deliveries from 1 to 65535"
                    ))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<LanePrefetch, E> {
                let text = text.trim();
                if text.eq_ignore_ascii_case("auto") {
                    return Ok(LanePrefetch::Auto);
                }
                match text.parse::<u64>() {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "`{text}` is not \"auto\" nor a number of deliveries from 1 to 65535"
                    ))),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl Serialize for LanePrefetch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LanePrefetch::Auto => s.serialize_str("auto"),
            LanePrefetch::Max(n) => s.serialize_u16(*n),
        }
    }
}

impl LaneSettings {
    /// Check the values parsing alone cannot.
    pub(super) fn validate(
        &self,
        channels: &BTreeMap<String, ChannelSettings>,
    ) -> Result<(), ConfigError> {
        if self.exchange.is_empty() {
            return Err(invalid("lanes.exchange", "must not be empty"));
        }
        if self.queue_prefix.is_empty() {
            return Err(invalid("lanes.queue_prefix", "must not be empty"));
        }
        if self.prefetch == LanePrefetch::Max(0) {
            return Err(invalid("lanes.prefetch", "must be at least 1"));
        }
        if self.park_after.0 > std::time::Duration::from_secs(10) {
            return Err(invalid("lanes.park_after", "must be at most 10s"));
        }
        for (name, c) in channels {
            if !(0.0..=0.5).contains(&c.reserve) {
                return Err(invalid(
                    format!("channels.{name}.reserve"),
                    format!("must be from 0 to 0.5, not {}", c.reserve),
                ));
            }
            if !(0.0..=1.0).contains(&c.normal_share) {
                return Err(invalid(
                    format!("channels.{name}.normal_share"),
                    format!("must be from 0 to 1, not {}", c.normal_share),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ChannelSettings, Settings};
    use std::collections::BTreeMap;

    #[test]
    fn park_after_is_at_most_ten_seconds() {
        let mut s = Settings::defaults();
        assert_eq!(s.lanes.park_after.0, std::time::Duration::from_millis(250));
        s.lanes.park_after = crate::config::Dur(std::time::Duration::from_secs(11));
        let e = s.lanes.validate(&s.channels).unwrap_err().to_string();
        assert!(e.contains("lanes.park_after"), "{e}");
    }

    #[test]
    fn fractions_and_names_are_checked() {
        let s = Settings::defaults();
        assert_eq!(s.lanes.exchange, "notify.lanes");
        assert!(s.lanes.validate(&s.channels).is_ok());
        let key_of = |c: ChannelSettings| {
            let channels = BTreeMap::from([("sms".to_string(), c)]);
            s.lanes
                .validate(&channels)
                .unwrap_err()
                .key()
                .map(str::to_string)
        };
        let reserve = ChannelSettings {
            reserve: 0.6,
            ..ChannelSettings::default()
        };
        assert_eq!(key_of(reserve).as_deref(), Some("channels.sms.reserve"));
        let share = ChannelSettings {
            normal_share: -0.1,
            ..ChannelSettings::default()
        };
        assert_eq!(key_of(share).as_deref(), Some("channels.sms.normal_share"));
        let mut l = s.lanes.clone();
        l.prefetch = super::LanePrefetch::Max(0);
        assert_eq!(
            l.validate(&s.channels).unwrap_err().key(),
            Some("lanes.prefetch")
        );
    }

    #[test]
    fn prefetch_is_auto_or_a_number_and_a_bad_one_names_its_key() {
        use super::LanePrefetch;
        assert_eq!(Settings::defaults().lanes.prefetch, LanePrefetch::Auto);
        // (value from the environment, expected)
        let table = [
            ("auto", Some(LanePrefetch::Auto)),
            ("AUTO", Some(LanePrefetch::Auto)),
            ("64", Some(LanePrefetch::Max(64))),
            ("65535", Some(LanePrefetch::Max(65535))),
            ("65536", None),
            ("-1", None),
            ("lots", None),
            ("0", None),
        ];
        for (value, want) in table {
            let vars = [(
                "QUOTA_WORKER__LANES__PREFETCH".to_string(),
                value.to_string(),
            )];
            match (Settings::load_from_vars(None, vars), want) {
                (Ok(s), Some(want)) => assert_eq!(s.lanes.prefetch, want, "{value}"),
                (Err(e), None) => assert_eq!(e.key(), Some("lanes.prefetch"), "{value}: {e}"),
                (got, want) => panic!("{value}: {got:?}, wanted {want:?}"),
            }
        }
        assert_eq!(
            LanePrefetch::Auto.ceiling(),
            crate::lanes::prefetch::AUTO_CEILING
        );
        assert_eq!(LanePrefetch::Max(32).ceiling(), 32);
        let text = toml::to_string(&Settings::defaults().lanes).unwrap();
        assert!(text.contains("prefetch = \"auto\""), "{text}");
    }

    #[test]
    fn the_keys_read_from_a_file_and_the_environment() {
        let vars = [(
            "QUOTA_WORKER__CHANNELS__SMS__RESERVE".to_string(),
            "0.25".to_string(),
        )];
        let s = Settings::load_from_vars(None, vars).unwrap();
        assert_eq!(s.channels["sms"].reserve, 0.25);
        assert_eq!(s.channels["sms"].normal_share, 0.1);
        assert_eq!(
            s.policies["transactional"].priority,
            crate::lanes::share::Priority::Urgent
        );
        assert_eq!(
            s.policies["default"].priority,
            crate::lanes::share::Priority::Normal
        );
    }
}
