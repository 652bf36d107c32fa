//! `quota-worker config check`, run as a person would: a file, the environment,
//! the output parsed as TOML, the error read for the key and the line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_quota-worker");

/// A configuration file in the temp directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &str) -> TempFile {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "qw-config-cli-{}-{}.toml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `quota-worker config check --config FILE`, with none of the caller's
/// `QUOTA_WORKER*` variables and with `env` added.
fn check(file: Option<&Path>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["config", "check"]);
    if let Some(f) = file {
        cmd.arg("--config").arg(f);
    }
    for (k, _) in std::env::vars() {
        if k.starts_with("QUOTA_WORKER") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run quota-worker")
}

/// The effective configuration printed by a successful check.
fn effective(out: &Output) -> toml::Table {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "config check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("output is not TOML: {e}\n{stdout}"))
}

/// The error of a failed check (stderr), asserting the failure.
fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "config check should fail");
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

fn get<'a>(t: &'a toml::Table, path: &str) -> &'a toml::Value {
    let mut parts = path.split('.');
    let mut at = &t[parts.next().unwrap()];
    for p in parts {
        at = &at[p];
    }
    at
}

#[test]
fn a_valid_file_prints_the_effective_configuration_with_secrets_redacted() {
    let file = TempFile::new(
        r#"
[amqp]
url = "amqp://producer:s3cret@broker.internal:5672/%2f"
prefetch = 64

[redis]
hash_key = "do-not-print-me"

[channels.sms]
rate = 10
period = "1s"
burst = 5

[policies.marketing]
rules = [{ limit = 2, window = "7d" }]
action = "drop"
"#,
    );
    let out = check(Some(&file.0), &[]);
    let t = effective(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("s3cret"), "{stdout}");
    assert!(!stdout.contains("do-not-print-me"), "{stdout}");

    assert_eq!(
        get(&t, "amqp.url").as_str(),
        Some("amqp://producer:***@broker.internal:5672/%2f")
    );
    assert_eq!(get(&t, "amqp.prefetch").as_integer(), Some(64));
    // From the file, merged with the defaults.
    assert_eq!(get(&t, "channels.sms.rate").as_integer(), Some(10));
    assert_eq!(get(&t, "channels.sms.burst").as_integer(), Some(5));
    assert!(
        t["channels"].get("email").is_some(),
        "default channels stay"
    );
    let rules = get(&t, "policies.marketing.rules").as_array().unwrap();
    assert_eq!(rules[0]["window"].as_str(), Some("7d"));
    assert_eq!(get(&t, "policies.marketing.action").as_str(), Some("drop"));
    // Untouched defaults.
    assert_eq!(
        get(&t, "redis.url").as_str(),
        Some("redis://127.0.0.1:6379")
    );
    assert_eq!(get(&t, "worker.default_timezone").as_str(), Some("UTC"));
    assert_eq!(get(&t, "amqp.delay_levels").as_integer(), Some(20));
}

#[test]
fn no_file_at_all_gives_the_documented_defaults() {
    let t = effective(&check(None, &[]));
    assert_eq!(
        get(&t, "amqp.url").as_str(),
        Some("amqp://guest:***@127.0.0.1:5672/%2f")
    );
    assert_eq!(get(&t, "http.listen").as_str(), Some("127.0.0.1:9464"));
    let channels: Vec<&String> = t["channels"].as_table().unwrap().keys().collect();
    assert_eq!(channels, ["email", "push", "sms"]);
}

#[test]
fn the_environment_overrides_the_file() {
    let file = TempFile::new("[redis]\nurl = \"redis://from-the-file:6379\"\n");
    let out = check(
        Some(&file.0),
        &[
            (
                "QUOTA_WORKER__REDIS__URL",
                "redis://:hunter2@from-the-env:6380",
            ),
            ("QUOTA_WORKER__AMQP__PREFETCH", "7"),
        ],
    );
    let t = effective(&out);
    assert_eq!(
        get(&t, "redis.url").as_str(),
        Some("redis://:***@from-the-env:6380")
    );
    assert_eq!(get(&t, "amqp.prefetch").as_integer(), Some(7));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
}

/// Each bad file: its text, the key the error must name, and the line it is on.
#[test]
fn bad_files_name_the_key_and_the_line() {
    let cases: &[(&str, &str, &str, usize, &str)] = &[
        (
            "an unknown key",
            "[amqp]\nprefetch = 8\nprefech = 5\n",
            "amqp.prefech",
            3,
            "unknown key",
        ),
        (
            "an unknown section",
            "[amqp]\nprefetch = 8\n\n[metrics]\nenabled = true\n",
            "metrics",
            4,
            "unknown key",
        ),
        (
            "a bad zone",
            "[worker]\n# where most recipients are\ndefault_timezone = \"Mars/Olympus\"\n",
            "worker.default_timezone",
            3,
            "`Mars/Olympus` is not an IANA time zone",
        ),
        (
            "rate 0",
            "[channels.sms]\nrate = 0\n",
            "channels.sms.rate",
            2,
            "must be at least 1",
        ),
        (
            "no runtime threads",
            "[worker]\nthreads = 0\n",
            "worker.threads",
            2,
            "must be at least 1",
        ),
        (
            "a bad window",
            "[policies.default]\nrules = [\n  { limit = 1, window = \"1d\" },\n  { limit = 3, window = \"7x\" },\n]\n",
            "policies.default.rules[1].window",
            4,
            "invalid window \"7x\"",
        ),
        (
            "a bad duration",
            "[channels.push]\nrate = 100\nperiod = \"7x\"\n",
            "channels.push.period",
            3,
            "invalid window \"7x\"",
        ),
        (
            "a wrong type",
            "[amqp]\nprefetch = \"lots\"\n",
            "amqp.prefetch",
            2,
            "invalid type: string \"lots\"",
        ),
        (
            "a wrong type in a table",
            "[http]\nenabled = \"maybe\"\n",
            "http.enabled",
            2,
            "expected a boolean",
        ),
        (
            "a missing key in a rule",
            "[policies.vip]\nrules = [{ limit = 5 }]\n",
            "policies.vip.rules[0].window",
            2,
            "required",
        ),
        (
            "a burst with no rate",
            "[channels.email]\nburst = 4\n",
            "channels.email.rate",
            1,
            "need a `rate`",
        ),
    ];
    for (what, text, key, line, detail) in cases {
        let file = TempFile::new(text);
        let err = failure(&check(Some(&file.0), &[]));
        let at = format!("{}:{line}:", file.0.display());
        assert!(err.contains(&at), "{what}: `{err}` should say {at}");
        assert!(
            err.contains(&format!("`{key}`")),
            "{what}: `{err}` should name `{key}`"
        );
        assert!(err.contains(detail), "{what}: `{err}` should say {detail}");
        assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
    }
}

#[test]
fn invalid_toml_gives_line_and_column() {
    let file = TempFile::new("[amqp]\nprefetch = 8\nurl = \"amqp://unterminated\n");
    let err = failure(&check(Some(&file.0), &[]));
    let at = format!("{}:3:", file.0.display());
    assert!(err.contains(&at), "`{err}` should say {at}");
    assert!(err.contains("not valid TOML"), "{err}");
}

#[test]
fn an_unreadable_file_names_its_path() {
    let missing = std::env::temp_dir().join(format!("qw-no-such-{}.toml", std::process::id()));
    let err = failure(&check(Some(&missing), &[]));
    assert!(
        err.contains(&format!(
            "cannot read configuration file {}",
            missing.display()
        )),
        "{err}"
    );
    assert!(err.contains("No such file"), "{err}");

    let dir = std::env::temp_dir();
    let err = failure(&check(Some(&dir), &[]));
    assert!(
        err.contains(&format!("cannot read configuration file {}", dir.display())),
        "{err}"
    );

    let file = TempFile::new("");
    std::fs::write(&file.0, [0xff, 0xfe, b'\n']).unwrap();
    let err = failure(&check(Some(&file.0), &[]));
    assert!(err.contains("cannot read configuration file"), "{err}");
    assert!(err.contains("UTF-8"), "{err}");
}

#[test]
fn a_bad_environment_variable_is_named() {
    let file = TempFile::new("[channels.sms]\nrate = 5\n");
    let err = failure(&check(
        Some(&file.0),
        &[("QUOTA_WORKER__CHANNELS__SMS__RATE", "0")],
    ));
    assert!(
        err.contains("environment variable QUOTA_WORKER__CHANNELS__SMS__RATE"),
        "the variable, not the file, set the bad value: {err}"
    );
    assert!(err.contains("`channels.sms.rate`"), "{err}");
}

#[test]
fn the_printed_configuration_is_itself_a_valid_file_once_its_hash_key_is_given() {
    let key = ("QUOTA_WORKER__REDIS__HASH_KEY", "a-real-secret");
    let first = check(None, &[("QUOTA_WORKER__CHANNELS__SMS__RATE", "3"), key]);
    effective(&first);
    let file = TempFile::new(&String::from_utf8_lossy(&first.stdout));
    // as printed, the key is the placeholder: loading it would hash with another key
    let refused = failure(&check(Some(&file.0), &[]));
    assert!(
        refused.contains("redis.hash_key") && refused.contains(&file.0.display().to_string()),
        "{refused}"
    );
    let second = check(Some(&file.0), &[key]);
    effective(&second);
    assert_eq!(first.stdout, second.stdout);
}

#[test]
fn the_built_in_hash_key_is_flagged_and_strict_fails_on_it() {
    let out = check(None, &[]);
    effective(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: redis.hash_key is the built-in default"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("# WARNING: redis.hash_key"), "{stdout}");
    assert!(
        stdout.contains("# broker 127.0.0.1:5672 vhost `/`: plaintext (no TLS)"),
        "{stdout}"
    );

    let mut cmd = Command::new(BIN);
    cmd.args(["config", "check", "--strict"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("QUOTA_WORKER") {
            cmd.env_remove(k);
        }
    }
    let strict = cmd.output().unwrap();
    assert_eq!(strict.status.code(), Some(2));
    let set = check(None, &[("QUOTA_WORKER__REDIS__HASH_KEY", "x")]);
    assert!(!String::from_utf8_lossy(&set.stderr).contains("warning"));
}
