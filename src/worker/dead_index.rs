//! Each dead letter the worker publishes, written to the browsable index beside the
//! queue ([`crate::admin::dead_index`]) in a task of its own, so the job never
//! waits for it; an index that Redis cannot take is logged and left behind (the
//! queue keeps the dead letter).

use lapin::BasicProperties;

use super::Worker;
use crate::admin::dead_index::{self, Known};
use crate::job::decode::Job;

impl Worker {
    /// Index the dead letter published with `props` and `body` (of `job`, when it
    /// was decoded), unless `console.dead_index` is 0.
    pub(super) fn index_dead(&self, props: &BasicProperties, body: &[u8], job: Option<&Job<'_>>) {
        let bound = self.settings.console.dead_index;
        if bound == 0 {
            return;
        }
        let known = job.map_or_else(Known::default, |job| {
            let tenant = job.tenant.as_deref();
            Known {
                policy: Some(
                    self.store
                        .rules()
                        .policy_of(&job.category, tenant)
                        .name
                        .clone(),
                ),
                channel: Some(job.channel.to_string()),
                recipient_tag: Some(
                    self.store
                        .keys()
                        .for_tenant(tenant)
                        .recipient_tag(&job.recipient),
                ),
                tenant: tenant.map(str::to_string),
            }
        });
        let entry = dead_index::entry(props, body, known, self.store.redis_now());
        let conn = self.store.connection();
        let keys = self.store.keys().clone();
        tokio::spawn(async move {
            if let Err(e) = dead_index::record(&conn, &keys, &entry, bound).await {
                tracing::warn!(error = %e, "could not index a dead letter (the queue keeps it)");
            }
        });
    }
}
