//! Which changes of the configuration a running worker can take on a reload, and
//! which need a restart ([`needs_restart`]): a comparison of two settings, the
//! running ones and the new.

use secrecy::ExposeSecret;

use super::Settings;

/// The keys whose change from `running` to `new` a running worker cannot apply
/// (connections, names of queues and keys, the worker's runtime, HTTP, the lane
/// queues, the set of channels, each of which names a dispatch queue), as dotted paths; empty
/// when only policies and channels' rates and windows differ. No value is
/// printed: some are secrets.
pub(crate) fn needs_restart(running: &Settings, new: &Settings) -> Vec<String> {
    fn diff(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        use serde_json::Value::Object;
        match (a, b) {
            (Object(x), Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let null = serde_json::Value::Null;
                    let (va, vb) = (x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null));
                    diff(&format!("{path}.{k}"), va, vb, out);
                }
            }
            (a, b) if a != b => out.push(path.to_string()),
            _ => {}
        }
    }
    let json = |v: &dyn erased::Section| v.json();
    let mut out = Vec::new();
    let sections: [(&str, &dyn erased::Section, &dyn erased::Section); 5] = [
        ("amqp", &running.amqp, &new.amqp),
        ("redis", &running.redis, &new.redis),
        ("worker", &running.worker, &new.worker),
        ("http", &running.http, &new.http),
        ("lanes", &running.lanes, &new.lanes),
    ];
    for (name, a, b) in sections {
        diff(name, &json(a), &json(b), &mut out);
    }
    if running.redis.hash_key.expose_secret() != new.redis.hash_key.expose_secret() {
        out.push("redis.hash_key".to_string());
    }
    let token = |s: &Settings| {
        s.http
            .admin_token
            .as_ref()
            .map(|t| t.expose_secret().to_string())
    };
    if running.http.admin_token.is_some()
        && new.http.admin_token.is_some()
        && token(running) != token(new)
    {
        out.push("http.admin_token".to_string());
    }
    // a token renamed, added or removed shows in the printed form; one changed
    // under its name does not
    for (name, token) in &running.http.admin_tokens {
        let now = new.http.admin_tokens.get(name);
        if now.is_some_and(|t| t.expose_secret() != token.expose_secret()) {
            out.push(format!("http.admin_tokens.{name}"));
        }
    }
    let (old, now): (Vec<&String>, Vec<&String>) = (
        running.channels.keys().collect(),
        new.channels.keys().collect(),
    );
    for c in old.iter().filter(|c| !now.contains(c)) {
        out.push(format!("channels.{c} (removed)"));
    }
    for c in now.iter().filter(|c| !old.contains(c)) {
        out.push(format!("channels.{c} (added)"));
    }
    out
}

/// A section of the settings as JSON, for [`needs_restart`].
mod erased {
    pub(crate) trait Section {
        fn json(&self) -> serde_json::Value;
    }

    impl<T: serde::Serialize> Section for T {
        fn json(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::needs_restart;
    use crate::config::env::env;
    use crate::config::Settings;
    use crate::quota::policy::Mode;

    #[test]
    fn a_restart_is_needed_for_connections_names_and_channels_not_for_rules() {
        let load = |vars: &[(&str, &str)]| Settings::load_with_env(None, env(vars)).unwrap();
        let base = load(&[]);
        let rules_only = load(&[
            ("QUOTA_WORKER__CHANNELS__SMS__RATE", "10"),
            ("QUOTA_WORKER__POLICIES__DEFAULT__MODE", "shadow"),
            ("QUOTA_WORKER__POLICIES__PROMO__MAX_WAIT", "1h"),
        ]);
        assert_eq!(needs_restart(&base, &rules_only), Vec::<String>::new());
        assert_eq!(rules_only.policies["default"].mode, Mode::Shadow);
        let fixed = load(&[
            (
                "QUOTA_WORKER__AMQP__URL",
                "amqp://u:secret@10.0.0.1:5672/%2f",
            ),
            ("QUOTA_WORKER__AMQP__JOBS_QUEUE", "other.jobs"),
            (
                "QUOTA_WORKER__REDIS__HASH_KEY",
                "another-key-of-32-characters-or-so",
            ),
            ("QUOTA_WORKER__HTTP__LISTEN", "127.0.0.1:1"),
            ("QUOTA_WORKER__CHANNELS__FAX__RATE", "1"),
        ]);
        let keys = needs_restart(&base, &fixed);
        assert_eq!(
            keys,
            [
                "amqp.jobs_queue",
                "amqp.url",
                "http.listen",
                "redis.hash_key",
                "channels.fax (added)"
            ],
            "no value is printed: {keys:?}"
        );
        assert!(!keys.concat().contains("secret"));
        let token = |t: &str| load(&[("QUOTA_WORKER__HTTP__ADMIN_TOKEN", t)]);
        assert_eq!(
            needs_restart(&token("a-token"), &token("b-token")),
            ["http.admin_token"]
        );
        assert_eq!(
            needs_restart(&base, &token("a-token")),
            ["http.admin_token"]
        );
        assert!(needs_restart(&token("a-token"), &token("a-token")).is_empty());
        let alice = |t: &str| load(&[("QUOTA_WORKER__HTTP__ADMIN_TOKENS__ALICE", t)]);
        assert_eq!(
            needs_restart(&alice("a-token"), &alice("b-token")),
            ["http.admin_tokens.alice"]
        );
        assert_eq!(
            needs_restart(&base, &alice("a-token")),
            ["http.admin_tokens"]
        );
        assert!(needs_restart(&alice("a-token"), &alice("a-token")).is_empty());
    }
}
