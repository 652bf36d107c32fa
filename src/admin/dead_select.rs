//! What a dead letter says of its job, for the one predicate that selects dead
//! letters everywhere ([`super::dead_index::Filter::matches`]): [`known`], the
//! body decoded with the rules in force; and the set of letters an action may
//! still touch, by their prints ([`Prints`], [`super::dead_letter_info::print`]).
//! Pure.

use std::collections::HashMap;

pub use super::dead_letter_info::print;

use super::dead_index::Known;
use crate::config::WorkerSettings;
use crate::job::decode;
use crate::store::QuotaStore;

/// What a dead letter's body says of its job, decoded with the rules in force in
/// `store` and the worker's settings (`worker`; nothing for a body that does not
/// decode).
pub fn known(body: &[u8], store: &QuotaStore, w: &WorkerSettings) -> Known {
    let (rules, keys) = (store.rules(), store.keys());
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

    #[test]
    fn prints_are_taken_as_many_times_as_listed() {
        let mut set = Prints::of(["a", "a", "b"]);
        assert!(set.take("a") && set.take("a") && !set.take("a"));
        assert!(!set.take("c"));
        assert_eq!(set.left(), 1);
    }
}
