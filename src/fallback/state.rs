//! The next step of a routed job, kept in Redis while the send of its step may
//! still fail: written after the step's dispatch is confirmed, read and removed when
//! the sender reports `failed`, then the job is published again to start from that
//! step. One string in the recipient's hash slot, `record_ttl` long: the step it
//! resumes at, its policy, the channel it leaves and the next, then the body.
//!
//! A failure reported twice, or a worker that dies between the publish and the
//! removal, publishes the job again: its admission on the next channel finds the
//! first copy's send and answers `duplicate`, so the step goes out once.

use redis::AsyncCommands;

use crate::redis::StoreError;
use crate::store::QuotaStore;

/// What a routed job's next step needs when its send fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextStep {
    /// The step it resumes at (1 is the first channel of `fallback`).
    pub step: usize,
    /// Its policy, for the count.
    pub policy: String,
    /// The channel whose send failed.
    pub from: String,
    /// The channel it moves on to.
    pub to: String,
    /// The job's body, untouched.
    pub body: Vec<u8>,
}

impl NextStep {
    fn encode(&self) -> Vec<u8> {
        let head = format!("{}|{}|{}|{}\n", self.step, self.policy, self.from, self.to);
        let mut out = Vec::with_capacity(head.len() + self.body.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    fn decode(value: &[u8]) -> Option<NextStep> {
        let cut = value.iter().position(|b| *b == b'\n')?;
        let head = std::str::from_utf8(&value[..cut]).ok()?;
        let mut parts = head.splitn(4, '|');
        Some(NextStep {
            step: parts.next()?.parse().ok()?,
            policy: parts.next()?.to_string(),
            from: parts.next()?.to_string(),
            to: parts.next()?.to_string(),
            body: value[cut + 1..].to_vec(),
        })
    }
}

/// Keep `next` for job `id` of `recipient` (under `tenant`) for `ttl_ms` (one key
/// per step: the step it leaves is `next.from`).
pub async fn keep(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
    id: &str,
    next: &NextStep,
    ttl_ms: u64,
) -> Result<(), StoreError> {
    let key = store
        .keys()
        .for_tenant(tenant)
        .route(recipient, id, &next.from);
    let mut conn = store.connection();
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(next.encode())
        .arg("PX")
        .arg(ttl_ms.max(1))
        .query_async(&mut conn)
        .await?;
    Ok(())
}

/// The next step kept for job `id` after its step on `channel`, if any (a value
/// no worker writes reads as none).
pub async fn next(
    store: &QuotaStore,
    tenant: Option<&str>,
    (recipient, id, channel): (&str, &str, &str),
) -> Result<Option<NextStep>, StoreError> {
    let key = store
        .keys()
        .for_tenant(tenant)
        .route(recipient, id, channel);
    let mut conn = store.connection();
    let value: Option<Vec<u8>> = conn.get(&key).await?;
    Ok(value.as_deref().and_then(NextStep::decode))
}

/// Forget the next step kept for job `id` after its step on `channel`.
pub async fn forget(
    store: &QuotaStore,
    tenant: Option<&str>,
    (recipient, id, channel): (&str, &str, &str),
) -> Result<(), StoreError> {
    let key = store
        .keys()
        .for_tenant(tenant)
        .route(recipient, id, channel);
    let mut conn = store.connection();
    let _: i64 = conn.del(&key).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::NextStep;

    #[test]
    fn a_next_step_reads_back_as_written() {
        let n = NextStep {
            step: 2,
            policy: "security".into(),
            from: "email".into(),
            to: "sms".into(),
            body: b"{\"id\":\"a\"}\n|x".to_vec(),
        };
        assert_eq!(NextStep::decode(&n.encode()), Some(n));
        assert_eq!(NextStep::decode(b"no head"), None);
    }
}
