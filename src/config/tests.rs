//! Tests of a whole configuration as loaded: the defaults, and errors located in
//! the file or the environment across sections.

use super::env::env;
use super::*;
use crate::quota::window::{Rule, Window};

#[test]
fn defaults_are_valid_and_as_documented() {
    let s = Settings::load_with_env(None, env(&[])).unwrap();
    assert_eq!(s.amqp.url, "amqp://guest:guest@127.0.0.1:5672/%2f");
    assert_eq!(s.redis.url, "redis://127.0.0.1:6379");
    assert_eq!(
        s.channels.keys().collect::<Vec<_>>(),
        ["email", "push", "sms"]
    );
    let policies = s.policies();
    let default = policies.iter().find(|p| p.name == "default").unwrap();
    assert_eq!(
        default.rules,
        vec![
            Rule {
                limit: 1,
                window: Window::CalendarDays(1)
            },
            Rule {
                limit: 3,
                window: Window::CalendarDays(7)
            }
        ]
    );
    let transactional = policies.iter().find(|p| p.name == "transactional").unwrap();
    assert!(transactional.rules.is_empty());
    assert_eq!(s.rate("sms"), None);
}

#[test]
fn bad_values_name_their_key() {
    for (vars, key) in [
        (
            vec![("QUOTA_WORKER__WORKER__DEFAULT_TIMEZONE", "Mars/Olympus")],
            "worker.default_timezone",
        ),
        (
            vec![("QUOTA_WORKER__CHANNELS__SMS__RATE", "0")],
            "channels.sms.rate",
        ),
        (
            vec![
                ("QUOTA_WORKER__CHANNELS__SMS__RATE", "5"),
                ("QUOTA_WORKER__CHANNELS__SMS__BURST", "0"),
            ],
            "channels.sms.burst",
        ),
        (vec![("QUOTA_WORKER__AMQP__PREFETCH", "0")], "amqp.prefetch"),
        (
            vec![("QUOTA_WORKER__REDIS__RESERVATION_LEASE", "1d")],
            "reservation_lease",
        ),
        (
            vec![("QUOTA_WORKER__REDIS__RECORD_TTL", "24h")],
            "redis.record_ttl",
        ),
    ] {
        let err = Settings::load_with_env(None, env(&vars))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err} should name {key}");
    }
}

#[test]
fn errors_in_a_file_carry_its_path_and_line() {
    let path = std::env::temp_dir().join(format!("qw-config-{}.toml", std::process::id()));
    std::fs::write(&path, "[amqp]\nprefetch = 8\n\n[channels.sms]\nrate = 0\n").unwrap();
    let err = Settings::load_with_env(Some(&path), env(&[])).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(err.key(), Some("channels.sms.rate"));
    assert_eq!(
        err.origin(),
        Some(&Origin::File {
            path: path.clone(),
            line: 5
        })
    );
    assert!(err
        .to_string()
        .starts_with(&format!("{}:5: ", path.display())));
}

#[test]
fn send_windows_load_typed_and_bad_ones_name_key_and_line() {
    let path = std::env::temp_dir().join(format!("qw-windows-{}.toml", std::process::id()));
    let write_and_load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let loaded = Settings::load_with_env(Some(&path), env(&[]));
        std::fs::remove_file(&path).unwrap();
        loaded
    };
    let s = write_and_load(
        "[policies.promo]\nrules = [{ limit = 1, window = \"1d\" }]\nmax_wait = \"72h\"\n\
         send_windows = [{ days = \"mon-fri\", from = \"08:00\", to = \"21:00\" },\n\
         { days = \"sat\", from = \"10:00\", to = \"18:00\" }]\n\n\
         [channels.sms]\nsend_windows = [{ days = \"daily\", from = \"22:00\", to = \"06:00\" }]\n",
    )
    .unwrap();
    let promo = s
        .policies()
        .into_iter()
        .find(|p| p.name == "promo")
        .unwrap();
    assert_eq!(
        promo.send_windows.unwrap().to_string(),
        "mon,tue,wed,thu,fri 08:00-21:00; sat 10:00-18:00"
    );
    assert_eq!(promo.max_wait, Some(chrono::Duration::days(3)));
    assert_eq!(
        s.channel_windows("sms").unwrap().to_string(),
        "mon,tue,wed,thu,fri,sat,sun 22:00-06:00"
    );
    // the defaults: `default` waits at most 7 days, `transactional` ignores windows
    let policies = s.policies();
    let by = |n: &str| policies.iter().find(|p| p.name == n).unwrap().clone();
    assert_eq!(by("default").max_wait, Some(chrono::Duration::days(7)));
    assert!(by("transactional").ignore_channel_windows);
    // what a file says back loads again to the same windows
    assert!(s.to_string().contains("send_windows"), "{s}");

    for (text, key, line, says) in [
        (
            "[policies.promo]\nsend_windows = [{ days = \"mon-fry\", from = \"08:00\", to = \"21:00\" }]\n",
            "policies.promo.send_windows",
            2,
            "`fry`",
        ),
        (
            "[channels.sms]\n\nsend_windows = [{ days = \"sat\", from = \"8:00\", to = \"21:00\" }]\n",
            "channels.sms.send_windows",
            3,
            "\"8:00\"",
        ),
        (
            "[channels.sms]\nsend_windows = []\n",
            "channels.sms.send_windows",
            2,
            "never opens",
        ),
        (
            "[policies.promo]\nmax_wait = \"10ms\"\n",
            "policies.promo.max_wait",
            2,
            "at least 1s",
        ),
    ] {
        let err = write_and_load(text).unwrap_err();
        assert_eq!(err.key(), Some(key), "{err}");
        assert_eq!(
            err.origin(),
            Some(&Origin::File {
                path: path.clone(),
                line
            }),
            "{err}"
        );
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[test]
fn a_digest_section_loads_typed_and_a_bad_one_names_key_and_line() {
    let path = std::env::temp_dir().join(format!("qw-digest-{}.toml", std::process::id()));
    let write_and_load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let loaded = Settings::load_with_env(Some(&path), env(&[]));
        std::fs::remove_file(&path).unwrap();
        loaded
    };
    let s = write_and_load(
        "[policies.social]\nrules = [{ limit = 1, window = \"1d\" }]\n\n\
         [policies.social.digest]\nmode = \"sliding\"\nwindow = \"15m\"\nmax_window = \"2h\"\n\
         keep = 3\nkeep_from = \"last\"\n",
    )
    .unwrap();
    let social = s
        .policies()
        .into_iter()
        .find(|p| p.name == "social")
        .unwrap();
    let d = social.digest.unwrap();
    assert_eq!(d.mode, crate::quota::digest::DigestMode::Sliding);
    assert_eq!(d.window, std::time::Duration::from_secs(900));
    assert_eq!(d.max_window, Some(std::time::Duration::from_secs(7200)));
    assert_eq!((d.max_items, d.keep), (100, 3));
    assert_eq!(d.keep_from, crate::quota::digest::KeepFrom::Last);
    assert!(s
        .policies()
        .iter()
        .all(|p| p.name == "social" || p.digest.is_none()));
    for (text, key, line) in [
        (
            "[policies.social.digest]\nmode = \"window\"\nwindow = \"15m\"\nkeep_from = \"middle\"\n",
            "policies.social.digest.keep_from",
            4,
        ),
        (
            "[policies.social.digest]\nmode = \"sliding\"\n\nwindow = \"15m\"\n",
            "policies.social.digest.max_window",
            0,
        ),
        (
            "[policies.social.digest]\nmode = \"window\"\nwindow = \"15m\"\nmax_items = 0\n",
            "policies.social.digest.max_items",
            4,
        ),
    ] {
        let err = write_and_load(text).unwrap_err();
        assert_eq!(err.key(), Some(key), "{err}");
        if line > 0 {
            assert_eq!(
                err.origin(),
                Some(&Origin::File {
                    path: path.clone(),
                    line
                }),
                "{err}"
            );
        }
    }
}

#[test]
fn tls_keys_need_a_tls_url_and_urls_are_checked() {
    for (vars, key, says) in [
        (
            vec![("QUOTA_WORKER__AMQP__TLS__CA_FILE", "/etc/ca.pem")],
            "amqp.tls.ca_file",
            "amqps://",
        ),
        (
            vec![("QUOTA_WORKER__REDIS__TLS__INSECURE_SKIP_VERIFY", "true")],
            "redis.tls.insecure_skip_verify",
            "rediss://",
        ),
        (
            vec![
                ("QUOTA_WORKER__AMQP__URL", "amqps://u:p@h/%2f"),
                ("QUOTA_WORKER__AMQP__TLS__CA_FILE", "/nonexistent/ca.pem"),
            ],
            "amqp.tls.ca_file",
            "/nonexistent/ca.pem",
        ),
        (
            vec![("QUOTA_WORKER__REDIS__URL", "rediss://h:6380/#insecure")],
            "redis.url",
            "insecure_skip_verify",
        ),
        (
            vec![("QUOTA_WORKER__AMQP__URL", "http://h:5672/")],
            "amqp.url",
            "amqp",
        ),
        (
            vec![
                ("QUOTA_WORKER__REDIS__URL", "rediss://h:6380"),
                ("QUOTA_WORKER__REDIS__TLS__SERVER_NAME", "x"),
            ],
            "redis.tls.server_name",
            "not supported",
        ),
    ] {
        let err = Settings::load_with_env(None, env(&vars)).unwrap_err();
        assert_eq!(err.key(), Some(key), "{err}");
        assert!(err.to_string().contains(says), "{err} should say {says}");
    }
}

#[test]
fn named_admin_tokens_load_from_the_file_the_environment_and_files_and_bad_ones_stop_it() {
    use secrecy::ExposeSecret;
    let dir = std::env::temp_dir().join(format!("qw-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (path, carol) = (dir.join("worker.toml"), dir.join("carol"));
    std::fs::write(&carol, "t-carol\n").unwrap();
    let load = |text: &str, vars: &[(&str, &str)]| {
        std::fs::write(&path, text).unwrap();
        Settings::load_with_env(Some(&path), env(vars))
    };
    let file = "[http]\nadmin_token = \"t-admin\"\nadmin_tokens = { alice = \"t-alice\" }\n";
    let s = load(
        file,
        &[
            ("QUOTA_WORKER__HTTP__ADMIN_TOKENS__BOB", "t-bob"),
            (
                "QUOTA_WORKER__HTTP__ADMIN_TOKENS__CAROL_FILE",
                carol.to_str().unwrap(),
            ),
        ],
    )
    .unwrap();
    let tokens: Vec<(String, String)> = (s.http.admin_tokens().into_iter())
        .map(|(n, t)| (n, t.expose_secret().to_string()))
        .collect();
    let want = [
        ("admin", "t-admin"),
        ("alice", "t-alice"),
        ("bob", "t-bob"),
        ("carol", "t-carol"),
    ];
    let want: Vec<(String, String)> = want.map(|(n, t)| (n.into(), t.into())).into();
    assert_eq!(tokens, want);
    let shown = s.to_string();
    assert!(
        !shown.contains("t-alice") && !shown.contains("t-carol"),
        "{shown}"
    );

    let twice = load(
        "[http]\nadmin_tokens = { alice = \"t\", bob = \"t\" }\n",
        &[],
    );
    let err = twice.unwrap_err();
    assert_eq!(err.key(), Some("http.admin_tokens.bob"));
    assert!(err.to_string().contains("same token"), "{err}");
    let err = load(
        "",
        &[("QUOTA_WORKER__HTTP__ADMIN_TOKENS__EVE", "two words")],
    )
    .unwrap_err();
    assert_eq!(err.key(), Some("http.admin_tokens.eve"));
    assert_eq!(
        err.origin(),
        Some(&Origin::Env {
            var: "QUOTA_WORKER__HTTP__ADMIN_TOKENS__EVE".into()
        })
    );
    let err = load(
        "[http]\nadmin_token = \"t\"\n\n[http.admin_tokens]\nadmin = \"u\"\n",
        &[],
    );
    let err = err.unwrap_err();
    assert_eq!(err.key(), Some("http.admin_tokens.admin"));
    std::fs::remove_dir_all(&dir).unwrap();
}
