//! The broker section (`[amqp]`): where the broker is, the names of the topology
//! the worker declares on it, and how much it takes at once.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::endpoint::{check_tls, Endpoint};
use super::error::{invalid, ConfigError};
use super::report::redact_url;
use super::text::Dur;
use crate::tls::TlsSettings;

/// Broker settings (`[amqp]`). `Debug` hides the URL's password.
///
/// One field per key of the table (the configuration reference lists them): it
/// mirrors the file's shape, so it has as many fields as `[amqp]` has keys.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    /// The broker's URL: `amqp://` for plaintext, `amqps://` for TLS (port 5671
    /// unless given), verified as `tls` says and never falling back to plaintext.
    /// Default `amqp://guest:guest@127.0.0.1:5672/%2f`. A secret: may come from the
    /// file named by `QUOTA_WORKER__AMQP__URL_FILE`; redacted wherever printed.
    pub url: String,
    /// Several broker nodes (a cluster without a load balancer), tried in turn; when
    /// set, `url` is not used. Every URL has the same scheme. Unset (the default):
    /// `url` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    /// TLS of an `amqps://` URL (`[amqp.tls]`); refused with `amqp://`.
    #[serde(default)]
    pub tls: TlsSettings,
    /// The fanout exchange producers publish jobs to (default `notify.jobs`).
    pub jobs_exchange: String,
    /// The queue the worker consumes jobs from, bound to `jobs_exchange` (default
    /// `notify.jobs`).
    pub jobs_queue: String,
    /// The direct exchange allowed jobs are published to, with the channel as
    /// routing key (default `notify.dispatch`).
    pub dispatch_exchange: String,
    /// Each channel's dispatch queue is this prefix followed by the channel's name
    /// (default `notify.dispatch.`); at most 191 characters.
    pub dispatch_queue_prefix: String,
    /// The fanout exchange of dead letters (default `notify.dead`).
    pub dead_exchange: String,
    /// The durable queue of dead letters (default `notify.dead`).
    pub dead_queue: String,
    /// How long the dead-letter queue keeps a dead letter (`x-message-ttl`),
    /// default `336h` (14 days); `0s`: no limit. Applied when the queue is
    /// declared; a queue declared before (or with another value) keeps its own,
    /// and the worker says so at start (a broker policy bounds it then:
    /// docs/guide/operating.md).
    pub dead_ttl: Dur,
    /// The most dead letters the queue keeps (`x-max-length`, the oldest dropped
    /// beyond), default 100000; 0: no limit. Applied as `dead_ttl` is.
    pub dead_max_length: u32,
    /// Prefix of the delay topology: exchanges `<prefix>.x<level>` and queues
    /// `<prefix>.<seconds>s` (default `notify.delay`).
    pub delay_prefix: String,
    /// Delay queues, one per power of two seconds from 1 s; 20 (the default) holds
    /// delays up to 2^20 - 1 s (12.1 days), longer waits come back and wait again.
    /// 1 to 30.
    pub delay_levels: u32,
    /// Type of the jobs and delay queues (default `quorum`).
    pub queue_type: QueueType,
    /// Unacknowledged deliveries the broker hands the worker at once, which is also
    /// the number of jobs in flight inside it (default 256; at least 1).
    pub prefetch: u16,
    /// Quorum queues: deliveries of one message before the broker dead-letters it
    /// (default 1000; at least 1).
    pub delivery_limit: u32,
    /// How often a publish waiting for its confirm checks that its connection is
    /// still up, and the bound on connecting and declaring (3 times it); default
    /// `10s`. While the connection is up a confirm is waited for however long the
    /// broker holds it (a memory or disk alarm, a pause): handing the job back
    /// would send it twice.
    pub publish_timeout: Dur,
}

/// Queue type of the jobs and delay queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Replicated queues with at-least-once dead-lettering (the default).
    Quorum,
    /// Classic queues, for a broker without quorum queues.
    Classic,
}

impl fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self;
        f.debug_struct("AmqpSettings")
            .field("url", &redact_url(&a.url))
            .field(
                "urls",
                &a.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .field("tls", &a.tls)
            .field("jobs_exchange", &a.jobs_exchange)
            .field("jobs_queue", &a.jobs_queue)
            .field("dispatch_exchange", &a.dispatch_exchange)
            .field("dispatch_queue_prefix", &a.dispatch_queue_prefix)
            .field("dead_exchange", &a.dead_exchange)
            .field("dead_queue", &a.dead_queue)
            .field("dead_ttl", &a.dead_ttl)
            .field("dead_max_length", &a.dead_max_length)
            .field("delay_prefix", &a.delay_prefix)
            .field("delay_levels", &a.delay_levels)
            .field("queue_type", &a.queue_type)
            .field("prefetch", &a.prefetch)
            .field("delivery_limit", &a.delivery_limit)
            .field("publish_timeout", &a.publish_timeout)
            .finish()
    }
}

impl AmqpSettings {
    /// The checks of the names and numbers, which parsing alone cannot make.
    pub(super) fn validate_values(&self) -> Result<(), ConfigError> {
        if self.prefetch == 0 {
            return Err(invalid("amqp.prefetch", "must be at least 1"));
        }
        if !(1..=30).contains(&self.delay_levels) {
            return Err(invalid("amqp.delay_levels", "must be between 1 and 30"));
        }
        if self.delivery_limit == 0 {
            return Err(invalid("amqp.delivery_limit", "must be at least 1"));
        }
        if self.dead_ttl.0 > std::time::Duration::from_millis(i32::MAX as u64) {
            return Err(invalid(
                "amqp.dead_ttl",
                "must be at most 596h (the broker's bound on a message TTL)",
            ));
        }
        for (key, name) in [
            ("amqp.jobs_exchange", &self.jobs_exchange),
            ("amqp.jobs_queue", &self.jobs_queue),
            ("amqp.dispatch_exchange", &self.dispatch_exchange),
            ("amqp.dead_exchange", &self.dead_exchange),
            ("amqp.dead_queue", &self.dead_queue),
            ("amqp.delay_prefix", &self.delay_prefix),
        ] {
            if name.is_empty() || name.len() > 200 {
                return Err(invalid(key, "must be 1 to 200 characters"));
            }
        }
        // the prefix plus a channel name (up to 64) must fit AMQP's 255-byte names
        if self.dispatch_queue_prefix.len() > 191 {
            return Err(invalid(
                "amqp.dispatch_queue_prefix",
                "must be at most 191 characters",
            ));
        }
        Ok(())
    }

    /// The broker URLs the worker connects to, in the order it tries them:
    /// `urls` when set, else `url`.
    pub(crate) fn connect_urls(&self) -> Vec<&str> {
        match self.urls.is_empty() {
            true => vec![self.url.as_str()],
            false => self.urls.iter().map(String::as_str).collect(),
        }
    }

    /// The broker URLs ([`AmqpSettings::connect_urls`]), parsed, with their TLS settings
    /// checked (files read): an `amqps://` URL whose TLS cannot be set up, TLS keys
    /// with `amqp://` URLs, and a list mixing both, are errors naming the key.
    pub(crate) fn endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        use lapin::uri::{AMQPScheme, AMQPUri};
        let key = if self.urls.is_empty() {
            "amqp.url"
        } else {
            "amqp.urls"
        };
        let mut out = Vec::new();
        for url in self.connect_urls() {
            let uri: AMQPUri = url.parse().map_err(|e| {
                invalid(
                    key,
                    format!("`{}` is not an AMQP URL: {e}", redact_url(url)),
                )
            })?;
            if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
                return Err(invalid(
                    key,
                    "must start with amqp:// (plaintext) or amqps:// (TLS)",
                ));
            }
            if uri.authority.host.is_empty() {
                return Err(invalid(key, format!("`{}` names no host", redact_url(url))));
            }
            out.push(Endpoint {
                tls: uri.scheme == AMQPScheme::AMQPS,
                host: uri.authority.host,
                port: uri.authority.port,
                vhost: Some(uri.vhost),
            });
        }
        let tls = out.iter().any(|e| e.tls);
        if tls && out.iter().any(|e| !e.tls) {
            return Err(invalid(
                key,
                "mixes amqp:// and amqps:// URLs; use one scheme for every node",
            ));
        }
        check_tls(&self.tls, "amqp", tls)?;
        if tls {
            for e in &out {
                crate::tls::server_name(&self.tls, &e.host)
                    .map_err(|e| invalid(e.key, e.reason))?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::env;
    use crate::config::Settings;

    #[test]
    fn values_out_of_range_name_their_key() {
        let key_of = |change: fn(&mut AmqpSettings)| {
            let mut a = Settings::defaults().amqp;
            change(&mut a);
            a.validate_values().unwrap_err().key().map(str::to_string)
        };
        assert_eq!(key_of(|a| a.prefetch = 0).as_deref(), Some("amqp.prefetch"));
        assert_eq!(
            key_of(|a| a.delay_levels = 31).as_deref(),
            Some("amqp.delay_levels")
        );
        assert_eq!(
            key_of(|a| a.delivery_limit = 0).as_deref(),
            Some("amqp.delivery_limit")
        );
        assert_eq!(
            key_of(|a| a.dead_queue.clear()).as_deref(),
            Some("amqp.dead_queue")
        );
        assert_eq!(
            key_of(|a| a.dispatch_queue_prefix = "p".repeat(192)).as_deref(),
            Some("amqp.dispatch_queue_prefix")
        );
        assert!(Settings::defaults().amqp.validate_values().is_ok());
    }

    #[test]
    fn several_broker_urls_are_checked_and_redacted_each() {
        let load = |vars: &[(&str, &str)]| Settings::load_with_env(None, env(vars));
        let s = load(&[(
            "QUOTA_WORKER__AMQP__URLS",
            "amqp://u:pw1@10.0.0.1:5672/%2f,amqp://u:pw2@10.0.0.2/prod",
        )])
        .unwrap();
        assert_eq!(
            s.amqp_urls(),
            [
                "amqp://u:pw1@10.0.0.1:5672/%2f",
                "amqp://u:pw2@10.0.0.2/prod"
            ]
        );
        let lines = s.connections();
        assert!(lines[0].starts_with("broker 10.0.0.1:5672"), "{lines:?}");
        assert!(
            lines[1].starts_with("broker 10.0.0.2:5672 vhost `prod`"),
            "{lines:?}"
        );
        let shown = format!("{s} {s:?}");
        assert!(!shown.contains("pw1") && !shown.contains("pw2"), "{shown}");
        // without urls, url alone
        assert_eq!(
            Settings::defaults().amqp_urls(),
            [Settings::defaults().amqp.url]
        );
        let mixed = load(&[(
            "QUOTA_WORKER__AMQP__URLS",
            "amqp://10.0.0.1/%2f,amqps://10.0.0.2/%2f",
        )])
        .unwrap_err()
        .to_string();
        assert!(
            mixed.contains("amqp.urls") && mixed.contains("mixes"),
            "{mixed}"
        );
        let bad = load(&[("QUOTA_WORKER__AMQP__URLS", "amqp://10.0.0.1/%2f,http://x")])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("amqp.urls"), "{bad}");
    }
}
