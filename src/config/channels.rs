//! The channels (`[channels.NAME]`): every job's channel must be one of them, each
//! with an optional send rate shared by all workers and optional send windows.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::text::{send_windows_text, Dur};
use crate::quota::policy::Rate;
use crate::quota::send_windows::SendWindows;

/// A channel (`[channels.NAME]`), with an optional GCRA send rate: `rate` jobs per
/// `period`, at most `burst` at once. Its name also names its dispatch queue.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelSettings {
    /// Jobs per `period` (at least 1); unset (the default): the channel is not
    /// paced, and `period` and `burst` are refused.
    pub rate: Option<u64>,
    /// The period `rate` counts in, longer than 0 and at most 100 years; unset: `1s`.
    pub period: Option<Dur>,
    /// Jobs that may go at once after a quiet spell (at least 1, and at least
    /// `cost`); unset: 1.
    pub burst: Option<u64>,
    /// What one job takes of the rate (default 1; at most `burst`).
    #[serde(default = "one")]
    pub cost: u64,
    /// When jobs may go out on this channel, in the recipient's zone, as a policy's
    /// `send_windows` are written; unset (the default): any time. A policy with
    /// `ignore_channel_windows` is not held by them.
    #[serde(
        default,
        with = "send_windows_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub send_windows: Option<SendWindows>,
    /// Paced channels: while urgent (or owed normal) jobs wait for the rate, a lower
    /// lane takes only while the bucket keeps this fraction of it (of `burst`
    /// jobs) per waiting lane above it: 0 to 0.5, default 0.5.
    #[serde(default = "half")]
    pub reserve: f64,
    /// Paced channels: the share of the rate `normal` jobs keep while urgent ones
    /// wait steadily: 0 to 1, default 0.1 (0: urgent always first).
    #[serde(default = "tenth")]
    pub normal_share: f64,
}

/// `channels.NAME.reserve` when unset.
pub const DEFAULT_RESERVE: f64 = 0.5;
/// `channels.NAME.normal_share` when unset.
pub const DEFAULT_NORMAL_SHARE: f64 = 0.1;

fn half() -> f64 {
    DEFAULT_RESERVE
}

fn tenth() -> f64 {
    DEFAULT_NORMAL_SHARE
}

impl Default for ChannelSettings {
    fn default() -> Self {
        ChannelSettings {
            rate: None,
            period: None,
            burst: None,
            cost: 1,
            send_windows: None,
            reserve: half(),
            normal_share: tenth(),
        }
    }
}

fn one() -> u64 {
    1
}

/// Check the channels: at least one, each named with 1 to 64 characters of
/// `a-z`, `A-Z`, `0-9`, `_` and `-`, each rate possible.
pub(super) fn validate(channels: &BTreeMap<String, ChannelSettings>) -> Result<(), ConfigError> {
    if channels.is_empty() {
        return Err(invalid("channels", "at least one channel is required"));
    }
    for (name, c) in channels {
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(invalid(
                format!("channels.{name}"),
                "channel names are 1 to 64 characters of a-z, A-Z, 0-9, `_` and `-`",
            ));
        }
        rate(name, c)?;
    }
    Ok(())
}

/// A channel's send rate from its settings, checked: `None` when it is not paced.
pub(super) fn rate(channel: &str, c: &ChannelSettings) -> Result<Option<Rate>, ConfigError> {
    let key = |k: &str| format!("channels.{channel}.{k}");
    let Some(rate) = c.rate else {
        if c.period.is_some() || c.burst.is_some() {
            return Err(invalid(key("rate"), "`period` and `burst` need a `rate`"));
        }
        return Ok(None);
    };
    gcra(
        &format!("channels.{channel}"),
        rate,
        c.period,
        c.burst,
        c.cost,
    )
    .map(Some)
}

/// A GCRA written at `path` (a channel's or a limit's): `rate` per `period`
/// (unset: 1s), `burst` (unset: 1), `cost` per job, checked; each refused value is
/// an error naming its key under `path`.
pub(super) fn gcra(
    path: &str,
    rate: u64,
    period: Option<Dur>,
    burst: Option<u64>,
    cost: u64,
) -> Result<Rate, ConfigError> {
    let key = |k: &str| format!("{path}.{k}");
    if rate == 0 {
        return Err(invalid(
            key("rate"),
            "must be at least 1 (leave it out for no limit)",
        ));
    }
    let period = period.map(|d| d.0).unwrap_or(Duration::from_secs(1));
    if period.is_zero() {
        return Err(invalid(key("period"), "must be longer than 0"));
    }
    let burst = burst.unwrap_or(1);
    if burst == 0 {
        return Err(invalid(key("burst"), "must be at least 1"));
    }
    if cost > burst {
        return Err(invalid(
            key("cost"),
            format!("a cost of {cost} can never pass a burst of {burst}"),
        ));
    }
    // Redis's Lua numbers are doubles, exact to 2^53 µs (about 285 years, of
    // which the current time takes 56): keep the bucket well inside that.
    const MAX_BUCKET_US: u64 = 100 * 366 * 86_400 * 1_000_000;
    if period.as_micros() > MAX_BUCKET_US as u128 {
        return Err(invalid(key("period"), "must be at most 100 years"));
    }
    let interval_us = (period.as_micros() as u64).div_ceil(rate).max(1);
    if interval_us
        .checked_mul(burst)
        .is_none_or(|bucket| bucket > MAX_BUCKET_US)
    {
        return Err(invalid(
            key("burst"),
            format!(
                "a burst of {burst} at one per {interval_us} µs is a bucket of over 100 years, \
                 more than Redis's Lua numbers hold exactly"
            ),
        ));
    }
    Ok(Rate {
        interval_us,
        burst,
        cost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paced(rate: u64, period: Duration, burst: Option<u64>, cost: u64) -> ChannelSettings {
        ChannelSettings {
            rate: Some(rate),
            period: Some(Dur(period)),
            burst,
            cost,
            ..ChannelSettings::default()
        }
    }

    #[test]
    fn a_rate_becomes_an_interval_and_a_burst() {
        let second = Duration::from_secs(1);
        assert_eq!(rate("sms", &ChannelSettings::default()).unwrap(), None);
        assert_eq!(
            rate("sms", &paced(3, second, Some(5), 2)).unwrap(),
            Some(Rate {
                interval_us: 333_334,
                burst: 5,
                cost: 2
            })
        );
        let key_of = |c: ChannelSettings| rate("sms", &c).unwrap_err().key().map(str::to_string);
        assert_eq!(
            key_of(ChannelSettings {
                burst: Some(2),
                ..ChannelSettings::default()
            })
            .as_deref(),
            Some("channels.sms.rate")
        );
        assert_eq!(
            key_of(paced(1, Duration::ZERO, None, 1)).as_deref(),
            Some("channels.sms.period")
        );
        assert_eq!(
            key_of(paced(1, second, Some(1), 2)).as_deref(),
            Some("channels.sms.cost")
        );
        assert_eq!(
            key_of(paced(1, second * 86_400 * 366, Some(200), 1)).as_deref(),
            Some("channels.sms.burst")
        );
    }

    #[test]
    fn channel_names_are_checked() {
        let one = |name: &str| BTreeMap::from([(name.to_string(), ChannelSettings::default())]);
        assert!(validate(&one("push-2_eu")).is_ok());
        assert_eq!(
            validate(&BTreeMap::new()).unwrap_err().key(),
            Some("channels")
        );
        assert_eq!(
            validate(&one("s m s")).unwrap_err().key(),
            Some("channels.s m s")
        );
    }
}
