//! Queue depths and consumers of every queue of the topology, read by passive
//! declares; a missing queue is reported as missing.

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::Connection;
use serde::Serialize;

use super::{is_not_found, AdminError};
use crate::amqp::Topology;

/// One queue of the topology, as the broker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueStat {
    /// Queue name.
    pub name: String,
    /// What it is for: `jobs`, `lane`, `delay`, `dispatch` or `dead`.
    pub role: &'static str,
    /// The lane's `<channel>.<priority>`, the delay level's seconds or the dispatch
    /// queue's channel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Whether the queue exists.
    pub exists: bool,
    /// Messages ready for delivery (not counting unacked ones); `None` when missing.
    pub ready: Option<u32>,
    /// Consumers attached; `None` when missing.
    pub consumers: Option<u32>,
    /// For a lane: the tenants whose jobs wait in their own queues of it (fair
    /// shares; read by [`tenants_waiting`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantsWaiting>,
}

/// The tenants whose jobs wait in a lane's tenant queues.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TenantsWaiting {
    /// How many tenants have jobs ready in the lane.
    pub waiting: u32,
    /// The tenants with the most jobs ready, most first (at most [`TOP`]).
    pub top: Vec<(String, u32)>,
}

/// How many tenants [`TenantsWaiting::top`] names.
pub const TOP: usize = 5;

/// Add to each lane of `stats` the tenants waiting in it: every tenant queue the
/// channel's set in Redis names, read by a passive declare (one gone meanwhile
/// counts as empty). A channel whose set names more than `most` queues is left
/// out (its lanes' `tenants` stay `None`): a declare each is what it costs.
pub async fn tenants_waiting(
    conn: &Connection,
    store: &crate::store::QuotaStore,
    topology: &Topology,
    (stats, most): (&mut [QueueStat], usize),
) -> Result<(), AdminError> {
    let mut ch = conn.create_channel().await?;
    for channel in &topology.laned {
        let key = store.keys().fair_queues(channel);
        let entries = crate::redis::fair::entries(&store.connection(), &key).await?;
        if entries.len() > most {
            continue;
        }
        for lane in crate::lanes::Priority::ALL {
            let mut waiting = TenantsWaiting::default();
            let mut all = Vec::new();
            for (entry, _) in &entries {
                let Some((l, tenant)) = crate::lanes::fair::parse_entry(entry) else {
                    continue;
                };
                if l != lane {
                    continue;
                }
                let queue = topology.tenant_queue(channel, lane, tenant);
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                };
                match ch
                    .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                    .await
                {
                    Ok(q) if q.message_count() > 0 => {
                        all.push((tenant.to_string(), q.message_count()))
                    }
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => ch = conn.create_channel().await?,
                    Err(e) => return Err(e.into()),
                }
            }
            all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            waiting.waiting = all.len() as u32;
            all.truncate(TOP);
            waiting.top = all;
            let name = topology.lane_queue(channel, lane);
            if let Some(stat) = stats.iter_mut().find(|q| q.name == name) {
                stat.tenants = Some(waiting);
            }
        }
    }
    let _ = ch.close(200, "tenants read".into()).await;
    Ok(())
}

/// Every queue of the topology, in the order jobs flow: jobs, lanes, delay levels,
/// dispatch queues, dead letters. A missing queue is reported, not an error.
pub async fn queue_stats(
    conn: &Connection,
    topology: &Topology,
) -> Result<Vec<QueueStat>, AdminError> {
    let ladder = topology.ladder();
    let mut wanted: Vec<(String, &'static str, Option<String>)> =
        vec![(topology.amqp.jobs_queue.clone(), "jobs", None)];
    wanted.extend(
        topology
            .lane_queues()
            .map(|(q, c, p)| (q, "lane", Some(p.routing_key(c)))),
    );
    wanted.extend(
        (0..ladder.levels).map(|n| (ladder.queue(n), "delay", Some(format!("{}s", 1u64 << n)))),
    );
    wanted.extend(
        topology
            .channels
            .iter()
            .map(|c| (topology.dispatch_queue(c), "dispatch", Some(c.clone()))),
    );
    wanted.push((topology.amqp.dead_queue.clone(), "dead", None));
    wanted.push((topology.feedback.1.clone(), "feedback", None));

    let mut ch = conn.create_channel().await?;
    let mut out = Vec::with_capacity(wanted.len());
    for (name, role, detail) in wanted {
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        match ch
            .queue_declare(name.as_str().into(), passive, FieldTable::default())
            .await
        {
            Ok(q) => out.push(QueueStat {
                name,
                role,
                detail,
                exists: true,
                ready: Some(q.message_count()),
                consumers: Some(q.consumer_count()),
                tenants: None,
            }),
            Err(e) if is_not_found(&e) => {
                // the broker closes the channel on a failed passive declare
                ch = conn.create_channel().await?;
                out.push(QueueStat {
                    name,
                    role,
                    detail,
                    exists: false,
                    ready: None,
                    consumers: None,
                    tenants: None,
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    let _ = ch.close(200, "queues read".into()).await;
    Ok(out)
}
