//! A recipient's suppressions: read (with `admin recipient`), added and lifted
//! (`admin recipient R suppress|unsuppress --channel C`). The effect is the same
//! as a sender's feedback ([`crate::feedback::apply`]), without its mark.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::AdminError;
use crate::feedback::apply;
use crate::quota::suppression::Kind;
use crate::store::QuotaStore;

/// One suppression in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SuppressionInfo {
    /// The channel it holds.
    pub channel: String,
    /// `bounced`, `complained` or `unsubscribed`.
    pub event: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// Until when; `None`: until removed.
    pub until: Option<DateTime<Utc>>,
}

/// `recipient`'s suppressions in force (only on `channel`, when given).
pub async fn list(
    store: &QuotaStore,
    recipient: &str,
    channel: Option<&str>,
) -> Result<Vec<SuppressionInfo>, AdminError> {
    let mut out: Vec<SuppressionInfo> =
        apply::suppressions(&store.connection(), store.keys(), recipient)
            .await?
            .into_iter()
            .filter(|(c, _)| channel.is_none_or(|only| only == c))
            .map(|(channel, s)| SuppressionInfo {
                channel,
                event: s.kind.as_str().to_string(),
                since: s.since,
                until: s.until,
            })
            .collect();
    out.sort_by(|a, b| a.channel.cmp(&b.channel));
    Ok(out)
}

/// Suppress `recipient` on `channel` by `kind` (a bounce for
/// `suppression.bounced_ttl`, the others until removed); the suppression kept
/// (an older one that lasts longer stays).
pub async fn suppress(
    store: &QuotaStore,
    settings: &crate::config::Settings,
    recipient: &str,
    channel: &str,
    kind: Kind,
) -> Result<SuppressionInfo, AdminError> {
    if !settings.channels.contains_key(channel) {
        return Err(AdminError::Invalid(format!(
            "channel `{channel}` is not configured"
        )));
    }
    let ttl = (kind == Kind::Bounced).then_some(settings.suppression.bounced_ttl.0);
    apply::suppress(store, recipient, channel, kind, ttl).await?;
    list(store, recipient, Some(channel))
        .await?
        .pop()
        .ok_or_else(|| AdminError::Invalid("the suppression lapsed at once".into()))
}

/// Lift `recipient`'s suppression on `channel`; whether there was one.
pub async fn unsuppress(
    store: &QuotaStore,
    recipient: &str,
    channel: &str,
) -> Result<bool, AdminError> {
    Ok(apply::unsuppress(store, recipient, channel).await?)
}
