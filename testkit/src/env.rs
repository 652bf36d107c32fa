//! A [`Settings`] as a `quota-worker` process receives it: `QUOTA_WORKER__SECTION__KEY`
//! variables for the scalar sections, and a configuration file for the tables that
//! cannot be variables (policies' rules, channels). The tests' binary runs and the
//! benchmark's worker processes get their names and settings so.

use quota_worker::config::Settings;
use serde_json::Value;

/// The environment that gives the binary `s`'s scalar sections (`[amqp]` with its
/// `[amqp.tls]`, `[redis]` with `[redis.tls]`, `[worker]`, `[http]`, `[lanes]`,
/// `[feedback]`, `[suppression]`) and each custom policy's scope, action and priority,
/// as `QUOTA_WORKER__SECTION__KEY` variables. The hash key and the admin token are
/// left out (they serialize redacted); a test that needs its own sets it.
/// Rules, lists of tables, cannot be variables: [`worker_toml`] writes them for a
/// file.
pub fn env_for(s: &Settings) -> Vec<(String, String)> {
    let v = serde_json::to_value(s).unwrap();
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    let mut env = Vec::new();
    for section in [
        "amqp",
        "redis",
        "worker",
        "http",
        "lanes",
        "feedback",
        "suppression",
    ] {
        let var = |k: &str| {
            format!(
                "QUOTA_WORKER__{}__{}",
                section.to_uppercase(),
                k.to_uppercase()
            )
        };
        for (k, v) in v[section].as_object().unwrap() {
            match v {
                // secrets are printed redacted: a test sets them itself
                _ if ["hash_key", "admin_token", "admin_tokens"].contains(&k.as_str()) => {}
                Value::Object(tls) => {
                    for (k2, v2) in tls {
                        env.push((format!("{}__{}", var(k), k2.to_uppercase()), scalar(v2)));
                    }
                }
                Value::Array(a) if a.is_empty() => {}
                v => env.push((var(k), scalar(v))),
            }
        }
    }
    for (name, p) in &s.policies {
        if name != "default" && name != "transactional" {
            let p = serde_json::to_value(p).unwrap();
            for key in ["scope", "action", "priority"] {
                env.push((
                    format!(
                        "QUOTA_WORKER__POLICIES__{}__{}",
                        name.to_uppercase(),
                        key.to_uppercase()
                    ),
                    scalar(&p[key]),
                ));
            }
        }
    }
    env
}

/// The environment of `quota-worker run` for `s` ([`env_for`]), HTTP off.
pub fn worker_env(s: &Settings) -> Vec<(String, String)> {
    let mut env = env_for(s);
    env.retain(|(k, _)| k != "QUOTA_WORKER__HTTP__ENABLED");
    env.push(("QUOTA_WORKER__HTTP__ENABLED".into(), "false".into()));
    env
}

/// A JSON value as a TOML value on one line (strings as JSON writes them, tables
/// inline; nulls are left out of tables).
fn toml_value(v: &Value) -> String {
    match v {
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(o) => {
            let kv: Vec<String> = o
                .iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| format!("{k} = {}", toml_value(x)))
                .collect();
            format!("{{ {} }}", kv.join(", "))
        }
        other => other.to_string(),
    }
}

/// Each entry of the map `section` of `s` (as JSON) as a `[section.NAME]` table,
/// its keys on lines of their own.
fn tables(out: &mut String, s: &Settings, section: &str) {
    let v = serde_json::to_value(s).unwrap();
    for (name, entry) in v[section].as_object().into_iter().flatten() {
        out.push_str(&format!("[{section}.{name}]\n"));
        for (k, x) in entry.as_object().into_iter().flatten() {
            if !x.is_null() {
                out.push_str(&format!("{k} = {}\n", toml_value(x)));
            }
        }
        out.push('\n');
    }
}

/// The `[policies.*]`, `[channels.*]`, `[limits.*]`, `[caps.*]` and `[tenants.*]`
/// tables of `s` as TOML.
pub fn worker_toml(s: &Settings) -> String {
    let mut out = String::new();
    tables(&mut out, s, "limits");
    tables(&mut out, s, "caps");
    tables(&mut out, s, "tenants");
    for (name, p) in &s.policies {
        out.push_str(&format!("[policies.{name}]\nrules = ["));
        let rules: Vec<String> = p
            .rules
            .iter()
            .map(|r| format!("{{ limit = {}, window = \"{}\" }}", r.limit, r.window))
            .collect();
        out.push_str(&rules.join(", "));
        let v = serde_json::to_value(p).unwrap();
        out.push_str(&format!(
            "]\nscope = {}\naction = {}\npriority = {}\n\n",
            v["scope"], v["action"], v["priority"]
        ));
        // its digest and fallback sections, each key as TOML (strings quoted,
        // numbers bare, arrays of strings as JSON writes them)
        for section in ["digest", "fallback"] {
            if let Some(d) = v[section].as_object() {
                out.push_str(&format!("[policies.{name}.{section}]\n"));
                for (k, x) in d {
                    out.push_str(&format!("{k} = {x}\n"));
                }
                out.push('\n');
            }
        }
    }
    for (name, c) in &s.channels {
        out.push_str(&format!("[channels.{name}]\n"));
        if let Some(rate) = c.rate {
            out.push_str(&format!("rate = {rate}\n"));
        }
        if let Some(p) = c.period {
            out.push_str(&format!(
                "period = \"{}\"\n",
                serde_json::to_value(p).unwrap().as_str().unwrap()
            ));
        }
        if let Some(b) = c.burst {
            out.push_str(&format!("burst = {b}\n"));
        }
        out.push_str(&format!(
            "cost = {}\nreserve = {}\nnormal_share = {}\n\n",
            c.cost, c.reserve, c.normal_share
        ));
    }
    out
}
