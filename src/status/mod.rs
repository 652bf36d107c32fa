//! What the status page (`/`) and `/status.json` show: readiness, the depth of
//! every queue (read every 5 s by the broker session, [`watch_queues`]), the jobs
//! settled in each of the last minutes by outcome (sampled every 5 s,
//! [`sample`]), dead letters by reason, the policies and channels in force, the
//! last reload, and whether Redis was found without its data (and jobs are held). Read-only; kept in memory, nothing is asked of the broker or
//! Redis to answer a request.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::admin::queues::QueueStat;
use crate::amqp::Topology;
use crate::health::Health;
use crate::job::Outcome;
use crate::reload::Reloader;

/// How often queues are read and outcomes sampled.
pub(crate) const EVERY: Duration = Duration::from_secs(5);
/// The most tenant queues of a channel whose depths are read every [`EVERY`] for the
/// overview (a passive declare each, per worker); beyond, `admin queues` reads them.
const TENANT_QUEUES_READ: usize = 1_000;
/// Samples kept: 15 minutes of them.
const KEPT: usize = 180;

/// One sample: the jobs settled so far by outcome kind.
#[derive(Debug, Clone, Copy)]
struct Sample {
    settled: [u64; Outcome::KINDS],
}

/// The running worker's state, as the status page shows it.
#[derive(Debug, Default)]
pub struct Status {
    queues: Mutex<Option<(DateTime<Utc>, Vec<QueueStat>)>>,
    samples: Mutex<VecDeque<Sample>>,
    reloader: OnceLock<Arc<Reloader>>,
}

/// `/status.json`.
///
/// Its fields are the document's top-level keys, one each (docs/guide: the status
/// page's contract): it mirrors the JSON a monitor reads, so it has as many fields
/// as the report has keys.
#[derive(Debug, Serialize)]
pub struct Report {
    /// When the report was made.
    pub at: DateTime<Utc>,
    /// Broker and Redis both up.
    pub ready: bool,
    /// Broker connected with the topology declared.
    pub broker: bool,
    /// Redis answering.
    pub redis: bool,
    /// When the queues were last read, and what they held.
    pub queues_at: Option<DateTime<Utc>>,
    /// Every queue of the topology.
    pub queues: Vec<QueueStat>,
    /// The sampling period (seconds) of `rates`.
    pub period_seconds: u64,
    /// Per outcome label (`dispatched`, `delayed`, ..., `dead`): jobs settled in
    /// each period of the last minutes, oldest first.
    pub rates: Vec<Series>,
    /// Jobs dead-lettered by this worker since it started, by reason.
    pub dead_by_reason: Vec<(String, u64)>,
    /// Jobs settled since start, by outcome label.
    pub totals: Vec<(String, u64)>,
    /// The policies in force.
    pub policies: Vec<PolicyView>,
    /// The channels in force.
    pub channels: Vec<ChannelView>,
    /// Feedback from the senders this worker counted since it started, by event.
    pub feedback: Vec<(&'static str, u64)>,
    /// Suppressions this worker added since it started, by kind.
    pub suppressions_added: Vec<(&'static str, u64)>,
    /// Each paced channel's send rate in force (jobs/s): 0 while paused after a
    /// provider's 429, then climbing back to the configured rate.
    pub channel_rates: Vec<(String, f64)>,
    /// The last reload, if any.
    pub last_reload: Option<crate::reload::ReloadReport>,
    /// Redis found without its data, and the pause (`redis.on_reset`).
    pub redis_resets: crate::reset::ResetView,
    /// The version running.
    pub version: &'static str,
}

/// One outcome's counts per period.
#[derive(Debug, Serialize)]
pub struct Series {
    /// `dispatched`, `delayed`, `duplicate`, `superseded` or `dead`.
    pub outcome: &'static str,
    /// Jobs in each period, oldest first.
    pub counts: Vec<u64>,
}

/// A policy as the page shows it.
#[derive(Debug, Serialize)]
pub struct PolicyView {
    /// Its name.
    pub name: String,
    /// `enforce` or `shadow`.
    pub mode: &'static str,
    /// Its rules, e.g. `1 per 1d`.
    pub rules: Vec<String>,
    /// Its send windows, if any.
    pub send_windows: Option<String>,
    /// `delay` or `drop`.
    pub action: &'static str,
    /// Its max_wait, if any.
    pub max_wait: Option<String>,
}

/// A channel as the page shows it.
#[derive(Debug, Serialize)]
pub struct ChannelView {
    /// Its name.
    pub name: String,
    /// Its send rate, e.g. `50 per 1s (burst 10)`; `None`: not paced.
    pub rate: Option<String>,
    /// Its send windows, if any.
    pub send_windows: Option<String>,
}

/// The outcome labels without the reason, in the order of the page.
const OUTCOMES: [&str; 7] = [
    "dispatched",
    "delayed",
    "duplicate",
    "superseded",
    "dead",
    "parked",
    "folded",
];

impl Status {
    /// Record the queues as just read.
    pub(crate) fn set_queues(&self, stats: Vec<QueueStat>) {
        *self.queues.lock().unwrap_or_else(|e| e.into_inner()) = Some((Utc::now(), stats));
    }

    /// Attach the reloader (once the store is connected): the page then shows the
    /// rules in force and the last reload, and `POST /reload` works.
    pub fn attach(&self, reloader: Arc<Reloader>) {
        let _ = self.reloader.set(reloader);
    }

    /// The reloader, once attached.
    pub fn reloader(&self) -> Option<&Arc<Reloader>> {
        self.reloader.get()
    }

    /// Take one sample of the jobs settled so far.
    pub fn sample(&self) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() == KEPT + 1 {
            samples.pop_front();
        }
        samples.push_back(Sample {
            settled: crate::metrics::settled(),
        });
    }

    /// Everything the page shows, now.
    pub fn report(&self, health: &Health) -> Report {
        let broker = health.broker.load(Ordering::Relaxed);
        let redis = health.redis.load(Ordering::Relaxed);
        let (queues_at, queues) = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map_or((None, Vec::new()), |(at, q)| (Some(at), q));
        let totals_by_kind = crate::metrics::settled();
        let samples: Vec<Sample> = self
            .samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        let by_outcome = |settled: &[u64; Outcome::KINDS], outcome: &str| -> u64 {
            (0..Outcome::KINDS)
                .filter(|k| Outcome::labels(*k).0 == outcome)
                .map(|k| settled[k])
                .sum()
        };
        let rates = OUTCOMES
            .iter()
            .map(|o| Series {
                outcome: o,
                counts: samples
                    .windows(2)
                    .map(|w| by_outcome(&w[1].settled, o) - by_outcome(&w[0].settled, o))
                    .collect(),
            })
            .collect();
        let dead_by_reason = (0..Outcome::KINDS)
            .filter(|k| Outcome::labels(*k).0 == "dead")
            .map(|k| (Outcome::labels(k).1.to_string(), totals_by_kind[k]))
            .collect();
        let totals = OUTCOMES
            .iter()
            .map(|o| (o.to_string(), by_outcome(&totals_by_kind, o)))
            .collect();
        let (policies, channels, last_reload) = match self.reloader.get() {
            Some(r) => {
                let rules = r.rules();
                (views::policies(&rules), views::channels(&rules), r.last())
            }
            None => (Vec::new(), Vec::new(), None),
        };
        Report {
            redis_resets: health.resets.view(),
            at: Utc::now(),
            ready: broker && redis,
            broker,
            redis,
            queues_at,
            queues,
            period_seconds: EVERY.as_secs(),
            rates,
            dead_by_reason,
            totals,
            policies,
            channels,
            feedback: crate::metrics::feedback_counts(),
            suppressions_added: crate::metrics::suppressions_added(),
            channel_rates: crate::metrics::channel_rates(),
            last_reload,
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}

mod views {
    use super::{ChannelView, PolicyView};
    use crate::quota::policy::Action;
    use crate::quota::window::Window;
    use crate::rules::Rules;

    pub fn policies(rules: &Rules) -> Vec<PolicyView> {
        rules
            .policies()
            .map(|p| PolicyView {
                name: p.name.clone(),
                mode: p.mode.as_str(),
                rules: p
                    .rules
                    .iter()
                    .map(|r| format!("{} per {}", r.limit, r.window))
                    .collect(),
                send_windows: p.send_windows.as_ref().map(|w| w.to_string()),
                action: match p.action {
                    Action::Delay => "delay",
                    Action::Drop => "drop",
                },
                max_wait: p.max_wait.map(|m| Window::Rolling(m).to_string()),
            })
            .collect()
    }

    pub fn channels(rules: &Rules) -> Vec<ChannelView> {
        rules
            .channels()
            .map(|(name, c)| ChannelView {
                name: name.clone(),
                rate: c.rate.map(|r| r.to_string()),
                send_windows: c.windows.as_ref().map(|w| w.to_string()),
            })
            .collect()
    }
}

/// Sample the settled jobs every [`EVERY`] until `shutdown`.
pub async fn sample(status: Arc<Status>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => status.sample(),
        }
    }
}

/// Read every queue of `topology` on `conn` every [`EVERY`] (passive declares on
/// one channel), into `status` and the queue gauges, until `stop`; with each lane
/// of a paced channel, the tenants waiting in it (the tenant queues `store` names,
/// [`crate::admin::tenants_waiting`]: a passive declare each, no gauge, so no label
/// per tenant), while the channel has at most [`TENANT_QUEUES_READ`] of them.
pub(crate) async fn watch_queues(
    status: Arc<Status>,
    (conn, store): (Arc<lapin::Connection>, Arc<crate::store::QuotaStore>),
    topology: Topology,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match crate::admin::queues::queue_stats(&conn, &topology).await {
            Ok(mut stats) => {
                for q in &stats {
                    if let (Some(ready), Some(consumers)) = (q.ready, q.consumers) {
                        crate::metrics::queue(q.role, &q.name, ready, consumers);
                    }
                }
                let most = TENANT_QUEUES_READ;
                let read =
                    crate::admin::tenants_waiting(&conn, &store, &topology, (&mut stats, most));
                if let Err(e) = read.await {
                    tracing::debug!(error = %e, "could not read the tenants waiting");
                }
                status.set_queues(stats);
            }
            Err(e) => tracing::debug!(error = %e, "could not read the queue depths"),
        }
    }
}
