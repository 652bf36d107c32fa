//! There is no Docker engine (nor systemd, nor Kubernetes) where these tests run, so
//! `docker-compose.yml`, the `Dockerfile` and the examples in `deploy/` are checked
//! as data: the fields each needs are there, and the worker's configuration, their
//! environments and the image agree. (`deploy/chroot-build.sh` builds the image's
//! two stages for real; it is not part of `cargo test`.)

use std::collections::BTreeMap;
use std::path::Path;

use quota_worker::config::{Settings, DEFAULT_HASH_KEY, ENV_PREFIX, SECRET_KEYS};
use secrecy::ExposeSecret;
use serde_norway::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn compose() -> Value {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docker-compose.yml"))
        .expect("docker-compose.yml at the root");
    serde_norway::from_str(&text).expect("docker-compose.yml is YAML")
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose
        .get("services")
        .and_then(|s| s.get(name))
        .unwrap_or_else(|| panic!("no service `{name}`"))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("expected a scalar, got {other:?}"),
    }
}

/// A service's environment, as a map (compose also allows a list of `K=V`).
fn environment(service: &Value) -> BTreeMap<String, String> {
    match service.get("environment") {
        None => BTreeMap::new(),
        Some(Value::Mapping(m)) => m.iter().map(|(k, v)| (text(k), text(v))).collect(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|i| {
                let i = text(i);
                let (k, v) = i.split_once('=').expect("K=V");
                (k.to_string(), v.to_string())
            })
            .collect(),
        Some(other) => panic!("environment must be a map or a list, got {other:?}"),
    }
}

/// `(host, container)` ports a service publishes (short syntax `"HOST:CONTAINER"`).
fn ports(service: &Value) -> Vec<(u16, u16)> {
    let Some(Value::Sequence(items)) = service.get("ports") else {
        return Vec::new();
    };
    items
        .iter()
        .map(|p| {
            let p = text(p);
            let parts: Vec<&str> = p.split(':').collect();
            let (host, container) = match parts.as_slice() {
                [c] => (*c, *c),
                [h, c] => (*h, *c),
                [_ip, h, c] => (*h, *c),
                _ => panic!("port `{p}`"),
            };
            (host.parse().unwrap(), container.parse().unwrap())
        })
        .collect()
}

/// `scheme://user:password@host:port/rest`, split.
#[derive(Debug, PartialEq)]
struct Url {
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    host: String,
    port: u16,
}

fn url(u: &str, default_port: u16) -> Url {
    let (scheme, rest) = u.split_once("://").expect("scheme://");
    let authority = rest.split('/').next().unwrap();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((ui, hp)) => (Some(ui), hp),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        Some(ui) => match ui.split_once(':') {
            Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
            None => (Some(ui.to_string()), None),
        },
        None => (None, None),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().expect("port")),
        None => (hostport.to_string(), default_port),
    };
    Url {
        scheme: scheme.to_string(),
        user,
        password,
        host,
        port,
    }
}

fn port_of(addr: &str) -> u16 {
    addr.parse::<std::net::SocketAddr>()
        .unwrap_or_else(|e| panic!("`{addr}`: {e}"))
        .port()
}

fn load(vars: &BTreeMap<String, String>) -> Settings {
    Settings::load_from_vars(None, vars.clone())
        .unwrap_or_else(|e| panic!("settings with {vars:?} do not load: {e}"))
}

fn defaults() -> Settings {
    load(&BTreeMap::new())
}

/// A compose value with its `${VAR:-default}` interpolations resolved as compose
/// does when `VAR` is not set.
fn interpolated(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find('}').expect("closing brace") + i;
        let inner = &rest[i + 2..end];
        out.push_str(inner.split_once(":-").map(|(_, d)| d).unwrap_or(""));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Every `QUOTA_WORKER__...` variable names a real key and its value takes effect:
/// load the settings with them, then find each value at its key. A `…_FILE`
/// variable must name a secret key and an absolute path (its file exists only where
/// the example is deployed); the hash key, printed redacted, is compared as loaded,
/// and must not be the built-in public one.
fn assert_env_takes_effect(vars: &BTreeMap<String, String>, place: &str) {
    let all: BTreeMap<String, String> = vars
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}__")))
        .map(|(k, v)| (k.clone(), interpolated(v)))
        .collect();
    assert!(!all.is_empty(), "{place} sets no {ENV_PREFIX}__ variable");
    let (files, ours): (BTreeMap<_, _>, BTreeMap<_, _>) =
        all.into_iter().partition(|(k, _)| k.ends_with("_FILE"));
    for (var, path) in &files {
        let key = var[ENV_PREFIX.len() + 2..var.len() - 5]
            .to_lowercase()
            .replace("__", ".");
        assert!(
            SECRET_KEYS.contains(&key.as_str()),
            "{place}: {var} names no key that may come from a file ({key})"
        );
        assert!(
            path.starts_with('/') || path.starts_with("%d/"),
            "{place}: {var}={path}"
        );
    }
    let loaded = load(&ours);
    if let Some(key) = ours.get(&format!("{ENV_PREFIX}__REDIS__HASH_KEY")) {
        assert_eq!(loaded.redis.hash_key.expose_secret(), key);
        assert_ne!(
            key, DEFAULT_HASH_KEY,
            "{place} sets the built-in public key"
        );
    }
    if let Some(token) = ours.get(&format!("{ENV_PREFIX}__HTTP__ADMIN_TOKEN")) {
        let loaded = loaded.http.admin_token.as_ref().map(|t| t.expose_secret());
        assert_eq!(loaded, Some(token.as_str()), "{place}: http.admin_token");
    }
    if let Some(token) = ours.get(&format!("{ENV_PREFIX}__HTTP__API_TOKEN")) {
        let loaded = loaded.http.api_token.as_ref().map(|t| t.expose_secret());
        assert_eq!(loaded, Some(token.as_str()), "{place}: http.api_token");
    }
    let effective = serde_json::to_value(&loaded).unwrap();
    for (var, value) in &ours {
        let path = var[ENV_PREFIX.len() + 2..].to_lowercase();
        if ["redis__hash_key", "http__admin_token", "http__api_token"].contains(&path.as_str()) {
            continue;
        }
        let mut at = &effective;
        for step in path.split("__") {
            at = at.get(step).unwrap_or_else(|| {
                panic!("{place}: {var} names no configuration key (no `{step}` in `{path}`)")
            });
        }
        let shown = match at {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map(String::from).unwrap_or(i.to_string()))
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        };
        assert_eq!(&shown, value, "{place}: {var} did not take effect");
    }
}

#[test]
fn every_service_has_an_image_or_a_build_and_a_health_check() {
    let c = compose();
    let Some(Value::Mapping(services)) = c.get("services") else {
        panic!("no services");
    };
    let names: Vec<String> = services.keys().map(text).collect();
    for name in ["rabbitmq", "redis", "worker"] {
        assert!(names.iter().any(|n| n == name), "service `{name}` missing");
    }
    // Keys compose knows (the ones a typo would most likely be meant as); a misspelt
    // key such as `healtcheck` would otherwise be noticed only by `docker compose`.
    let known = [
        "build",
        "image",
        "command",
        "entrypoint",
        "environment",
        "env_file",
        "ports",
        "expose",
        "healthcheck",
        "depends_on",
        "restart",
        "stop_grace_period",
        "stop_signal",
        "volumes",
        "networks",
        "init",
        "user",
        "container_name",
        "labels",
        "profiles",
    ];
    for name in &names {
        let s = service(&c, name);
        let Value::Mapping(m) = s else {
            panic!("service `{name}` is not a map")
        };
        for k in m.keys().map(text) {
            assert!(known.contains(&k.as_str()), "service `{name}`: key `{k}`");
        }
        assert!(
            s.get("image").is_some() || s.get("build").is_some(),
            "service `{name}` has neither image nor build"
        );
        let test = s
            .get("healthcheck")
            .and_then(|h| h.get("test"))
            .unwrap_or_else(|| panic!("service `{name}` has no healthcheck.test"));
        let Value::Sequence(test) = test else {
            panic!("service `{name}`: healthcheck.test should be a list")
        };
        let first = text(&test[0]);
        assert!(
            first == "CMD" || first == "CMD-SHELL",
            "service `{name}`: healthcheck.test starts with CMD or CMD-SHELL"
        );
        assert!(
            test.len() >= 2,
            "service `{name}`: healthcheck runs nothing"
        );
        assert!(
            s.get("restart").is_some(),
            "service `{name}` has no restart"
        );
    }
    let top: Vec<String> = match &c {
        Value::Mapping(m) => m.keys().map(text).collect(),
        _ => panic!("compose file is not a map"),
    };
    for k in top {
        assert!(
            ["name", "services", "volumes", "networks", "configs", "secrets"].contains(&k.as_str()),
            "top-level key `{k}`"
        );
    }
}

#[test]
fn the_dependencies_are_the_ones_the_compose_file_expects() {
    let c = compose();
    let rabbit = service(&c, "rabbitmq");
    let image = text(rabbit.get("image").unwrap());
    assert!(
        image.starts_with("rabbitmq:") && image.ends_with("-management"),
        "RabbitMQ with its management UI, got {image}"
    );
    let test: Vec<String> = match rabbit.get("healthcheck").and_then(|h| h.get("test")) {
        Some(Value::Sequence(t)) => t.iter().map(text).collect(),
        _ => panic!("rabbitmq healthcheck"),
    };
    assert_eq!(test, ["CMD", "rabbitmq-diagnostics", "-q", "ping"]);

    let redis = service(&c, "redis");
    assert!(text(redis.get("image").unwrap()).starts_with("redis:7"));
    let command: Vec<String> = match redis.get("command") {
        Some(Value::Sequence(t)) => t.iter().map(text).collect(),
        _ => panic!("redis command as a list"),
    };
    let after = |flag: &str| {
        let i = command.iter().position(|c| c == flag);
        i.and_then(|i| command.get(i + 1)).map(String::as_str)
    };
    assert_eq!(after("--save"), Some(""), "no snapshots: {command:?}");
    assert_eq!(after("--appendonly"), Some("no"), "no AOF: {command:?}");
    let test: Vec<String> = match redis.get("healthcheck").and_then(|h| h.get("test")) {
        Some(Value::Sequence(t)) => t.iter().map(text).collect(),
        _ => panic!("redis healthcheck"),
    };
    assert_eq!(test, ["CMD", "redis-cli", "ping"]);
}

#[test]
fn the_worker_waits_for_healthy_dependencies() {
    let c = compose();
    let worker = service(&c, "worker");
    assert_eq!(text(worker.get("build").unwrap()), ".");
    let depends = worker.get("depends_on").expect("worker depends_on");
    for dep in ["rabbitmq", "redis"] {
        let condition = depends
            .get(dep)
            .and_then(|d| d.get("condition"))
            .unwrap_or_else(|| panic!("worker depends_on {dep} with a condition"));
        assert_eq!(text(condition), "service_healthy", "{dep}");
    }
}

#[test]
fn the_worker_environment_names_real_keys() {
    let c = compose();
    let env = environment(service(&c, "worker"));
    for var in [
        "QUOTA_WORKER__AMQP__URL",
        "QUOTA_WORKER__REDIS__URL",
        "QUOTA_WORKER__HTTP__LISTEN",
    ] {
        assert!(env.contains_key(var), "worker sets {var}");
    }
    assert_env_takes_effect(&env, "docker-compose.yml");
}

#[test]
fn a_misspelt_variable_would_be_caught() {
    // The check above relies on unknown keys failing to load.
    let vars = BTreeMap::from([(
        "QUOTA_WORKER__HTTP__LISTEN_ADDR".to_string(),
        "0.0.0.0:1".to_string(),
    )]);
    let err = Settings::load_from_vars(None, vars)
        .unwrap_err()
        .to_string();
    assert!(err.contains("http.listen_addr"), "{err}");
}

#[test]
fn the_urls_point_at_the_compose_services_with_their_credentials() {
    let c = compose();
    let env = environment(service(&c, "worker"));
    let rabbit = service(&c, "rabbitmq");
    let rabbit_env = environment(rabbit);

    let amqp = url(&env["QUOTA_WORKER__AMQP__URL"], 5672);
    assert_eq!(amqp.scheme, "amqp");
    assert_eq!(amqp.host, "rabbitmq", "the AMQP URL names the service");
    assert_eq!(
        amqp.user.as_deref(),
        rabbit_env.get("RABBITMQ_DEFAULT_USER").map(|s| s.as_str())
    );
    assert_eq!(
        amqp.password.as_deref(),
        rabbit_env.get("RABBITMQ_DEFAULT_PASS").map(|s| s.as_str())
    );
    assert_ne!(
        amqp.user.as_deref(),
        Some("guest"),
        "RabbitMQ refuses `guest` from another container"
    );
    assert!(
        ports(rabbit).iter().any(|(_, c)| *c == amqp.port),
        "rabbitmq serves the URL's port {}",
        amqp.port
    );

    let redis_url = url(&env["QUOTA_WORKER__REDIS__URL"], 6379);
    assert_eq!(redis_url.scheme, "redis");
    assert_eq!(redis_url.host, "redis", "the Redis URL names the service");
    assert!(
        ports(service(&c, "redis"))
            .iter()
            .any(|(_, c)| *c == redis_url.port),
        "redis serves the URL's port {}",
        redis_url.port
    );
}

#[test]
fn the_published_ports_match_the_configuration() {
    let c = compose();
    let d = defaults();

    // The worker listens on all interfaces in its container, on the port it publishes,
    // and the host port is the documented default (so http://127.0.0.1:9464 works).
    let worker = service(&c, "worker");
    let listen = &environment(worker)["QUOTA_WORKER__HTTP__LISTEN"];
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    assert!(
        addr.ip().is_unspecified(),
        "{listen} is reachable from outside"
    );
    let default_port = port_of(&d.http.listen);
    assert!(
        ports(worker).contains(&(default_port, addr.port())),
        "worker publishes {default_port}:{}, has {:?}",
        addr.port(),
        ports(worker)
    );

    // The brokers' host ports are the worker's defaults, so the CLI on the host
    // reaches the stack with no configuration but the AMQP user.
    let amqp_default = url(&d.amqp.url, 5672);
    assert!(ports(service(&c, "rabbitmq")).contains(&(amqp_default.port, 5672)));
    assert!(ports(service(&c, "rabbitmq"))
        .iter()
        .any(|(_, c)| *c == 15672));
    let redis_default = url(&d.redis.url, 6379);
    assert!(ports(service(&c, "redis")).contains(&(redis_default.port, 6379)));
}

/// `"30s"`, `"1m30s"`, `"500ms"` in compose's duration format.
fn compose_duration(s: &str) -> std::time::Duration {
    let mut total = std::time::Duration::ZERO;
    let mut number = String::new();
    let mut chars = s.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch.is_ascii_digit() {
            number.push(ch);
            continue;
        }
        let n: u64 = number.parse().expect("number before unit");
        number.clear();
        let unit = match (ch, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                "ms"
            }
            ('h', _) => "h",
            ('m', _) => "m",
            ('s', _) => "s",
            _ => panic!("duration `{s}`"),
        };
        total += match unit {
            "ms" => std::time::Duration::from_millis(n),
            "s" => std::time::Duration::from_secs(n),
            "m" => std::time::Duration::from_secs(60 * n),
            _ => std::time::Duration::from_secs(3600 * n),
        };
    }
    assert!(number.is_empty(), "duration `{s}` has no unit");
    total
}

#[test]
fn the_worker_gets_time_to_finish_its_jobs_on_stop() {
    let c = compose();
    let grace = compose_duration(&text(
        service(&c, "worker")
            .get("stop_grace_period")
            .expect("worker stop_grace_period"),
    ));
    let shutdown = defaults().worker.shutdown_grace.0;
    assert!(
        grace > shutdown,
        "stop_grace_period {grace:?} must exceed worker.shutdown_grace {shutdown:?}"
    );
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped, and
/// grouped by stage (`FROM` starts one).
fn dockerfile_stages() -> Vec<Vec<(String, String)>> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("Dockerfile");
    let mut stages: Vec<Vec<(String, String)>> = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let instruction = std::mem::take(&mut pending);
        let (keyword, rest) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or((&instruction, ""));
        let keyword = keyword.to_uppercase();
        if keyword == "FROM" {
            stages.push(Vec::new());
        }
        stages
            .last_mut()
            .expect("the Dockerfile starts with FROM")
            .push((keyword, rest.trim().to_string()));
    }
    stages
}

fn instructions<'a>(stage: &'a [(String, String)], keyword: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter(|(k, _)| k == keyword)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[test]
fn the_dockerfile_runs_the_binary_on_the_published_port() {
    let stages = dockerfile_stages();
    assert!(stages.len() >= 2, "a multi-stage build");
    let last = stages.last().unwrap();

    assert_eq!(instructions(last, "ENTRYPOINT"), [r#"["quota-worker"]"#]);
    assert_eq!(instructions(last, "CMD"), [r#"["run"]"#]);
    assert!(
        instructions(last, "COPY")
            .iter()
            .any(|c| c.starts_with("--from=") && c.ends_with("/usr/local/bin/quota-worker")),
        "the final stage copies the binary onto PATH"
    );
    let builder = &stages[0];
    assert!(
        instructions(builder, "RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked")),
        "the builder builds the locked release"
    );

    let user = instructions(last, "USER");
    let user = user.last().expect("the final stage sets USER");
    assert!(
        !["root", "0"].contains(&user.split(':').next().unwrap()),
        "runs as {user}"
    );

    let c = compose();
    let worker = service(&c, "worker");
    let exposed: Vec<u16> = instructions(last, "EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp").parse().unwrap())
        .collect();
    for (_, container) in ports(worker) {
        assert!(exposed.contains(&container), "EXPOSE {container}");
    }

    // The image's own environment names real keys, and agrees with compose.
    let image_env: BTreeMap<String, String> = instructions(last, "ENV")
        .iter()
        .map(|e| {
            let (k, v) = e.split_once('=').expect("ENV K=V");
            (k.to_string(), v.trim_matches('"').to_string())
        })
        .collect();
    assert_env_takes_effect(&image_env, "Dockerfile");
    for (k, v) in &image_env {
        if let Some(theirs) = environment(worker).get(k) {
            assert_eq!(theirs, v, "{k} differs between Dockerfile and compose");
        }
    }

    // The health check's tool is installed in the runtime image.
    let test: Vec<String> = match worker.get("healthcheck").and_then(|h| h.get("test")) {
        Some(Value::Sequence(t)) => t.iter().map(text).collect(),
        _ => panic!("worker healthcheck"),
    };
    let tool = &test[1];
    assert!(
        tool == "quota-worker"
            || instructions(last, "RUN")
                .iter()
                .any(|r| r.contains("apt-get install") && r.split_whitespace().any(|w| w == tool)),
        "the runtime image installs `{tool}`"
    );
    // `quota-worker health` asks /healthz on http.listen, which the environment sets
    assert_eq!(test, ["CMD", "quota-worker", "health"]);
    assert_eq!(
        instructions(last, "HEALTHCHECK")
            .iter()
            .map(|h| h.ends_with(r#"CMD ["quota-worker", "health"]"#))
            .collect::<Vec<_>>(),
        [true],
        "the image's own HEALTHCHECK is the binary's"
    );
    assert!(
        !instructions(last, "RUN").iter().any(|r| r.contains("curl")),
        "the runtime image needs no curl"
    );
    // the builder installs what jemalloc's build runs
    let build_packages = instructions(builder, "ARG")
        .iter()
        .find_map(|a| a.strip_prefix("BUILD_PACKAGES="))
        .map(|p| p.trim_matches('"').to_string())
        .expect("ARG BUILD_PACKAGES in the builder");
    assert!(build_packages.split_whitespace().any(|p| p == "make"));
    // images pinned to a release, not a moving major tag
    let from: Vec<&str> = stages.iter().map(|st| st[0].1.as_str()).collect();
    assert!(
        from[0].starts_with("rust:1.") && from[0].contains("-slim-bookworm"),
        "{from:?}"
    );
    assert!(
        from[1].starts_with("debian:bookworm"),
        "the runtime matches the builder's glibc"
    );
}

#[test]
fn the_stack_hashes_recipients_with_a_key_of_its_own() {
    let c = compose();
    let env = environment(service(&c, "worker"));
    let key = interpolated(&env["QUOTA_WORKER__REDIS__HASH_KEY"]);
    assert!(!key.is_empty() && key != DEFAULT_HASH_KEY, "{key}");
    assert!(load(
        &env.clone()
            .into_iter()
            .map(|(k, v)| (k, interpolated(&v)))
            .collect()
    )
    .warnings()
    .is_empty());
}

/// A systemd unit's `[Service]` settings, in order (repeated keys kept).
fn unit_settings(text: &str) -> Vec<(String, String)> {
    let mut section = "";
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if !line.is_empty() && !line.starts_with('#') && section == "[Service]" {
            let (k, v) = line.split_once('=').expect("key=value");
            out.push((k.to_string(), v.to_string()));
        }
    }
    out
}

#[test]
fn the_systemd_unit_runs_the_worker_with_its_secrets_and_time_to_stop() {
    let path = Path::new(ROOT).join("deploy/quota-worker.service");
    let text = std::fs::read_to_string(&path).unwrap();
    let unit = unit_settings(&text);
    let get = |k: &str| {
        unit.iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("ExecStart"), ["/usr/local/bin/quota-worker run"]);
    let env: BTreeMap<String, String> = get("Environment")
        .iter()
        .map(|e| {
            let (k, v) = e.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    assert_env_takes_effect(&env, "deploy/quota-worker.service");
    assert_eq!(env["QUOTA_WORKER__REDIS__HASH_KEY_FILE"], "%d/hash_key");
    assert!(get("LoadCredential")
        .iter()
        .any(|c| c.starts_with("hash_key:")));
    let stop = compose_duration(&format!("{}s", get("TimeoutStopSec")[0]));
    assert!(
        stop > defaults().worker.shutdown_grace.0,
        "TimeoutStopSec {stop:?}"
    );

    // systemd's own reading of the unit, with the binary where ExecStart expects it
    let Ok(out) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    else {
        eprintln!("skipped systemd-analyze verify: not installed");
        return;
    };
    assert!(out.status.success());
    let dir = std::env::temp_dir().join(format!("qw-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("quota-worker.service");
    let bin = env!("CARGO_BIN_EXE_quota-worker");
    std::fs::write(&copy, text.replace("/usr/local/bin/quota-worker", bin)).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

#[test]
fn the_kubernetes_example_probes_what_the_worker_serves() {
    // deploy/kubernetes.yaml is the Helm chart rendered (deploy/helm/check.py checks
    // that it is); here: what it asks of the worker is what the worker does
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("deploy/kubernetes.yaml")).unwrap();
    let docs: Vec<Value> = serde_norway::Deserializer::from_str(&manifest)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML document"))
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d.get("kind").map(text) == Some(k.to_string()))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let secret = kind("Secret");
    let deployment = kind("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_u64(),
        Some(10001),
        "the image's USER"
    );
    let container = &pod["containers"][0];
    let env: BTreeMap<String, String> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| (text(&e["name"]), text(&e["value"])))
        .collect();
    assert_env_takes_effect(&env, "deploy/kubernetes.yaml");
    // listening on the pod's address: the mutating endpoints and the preferences API
    // need their tokens
    for var in [
        "QUOTA_WORKER__HTTP__ADMIN_TOKEN_FILE",
        "QUOTA_WORKER__HTTP__API_TOKEN_FILE",
        "QUOTA_WORKER__REDIS__HASH_KEY_FILE",
    ] {
        assert!(env.contains_key(var), "deploy/kubernetes.yaml: no {var}");
    }
    // the configuration is the ConfigMap's file, where QUOTA_WORKER_CONFIG says
    let config_path = Path::new(&env["QUOTA_WORKER_CONFIG"]);
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let mount_of = |volume: &str| {
        mounts
            .iter()
            .find(|m| text(&m["name"]) == volume)
            .map(|m| text(&m["mountPath"]))
            .unwrap_or_else(|| panic!("no mount of {volume}"))
    };
    assert_eq!(
        config_path.parent().unwrap(),
        Path::new(&mount_of("config"))
    );
    let file = config_path.file_name().unwrap().to_str().unwrap();
    let toml = kind("ConfigMap")["data"][file].as_str().unwrap();
    let dir = std::env::temp_dir().join(format!("qw-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file), toml).unwrap();
    let settings = Settings::load_from_vars(Some(&dir.join(file)), Vec::new());
    std::fs::remove_dir_all(&dir).unwrap();
    let settings = settings.expect("the ConfigMap's configuration loads");
    assert!(
        std::time::Duration::from_secs(grace) > settings.worker.shutdown_grace.0,
        "terminationGracePeriodSeconds {grace}"
    );
    // the probes ask what the worker serves, on the port it listens on
    let listen = port_of(&settings.http.listen);
    let named_port = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| text(&p["name"]) == "http")
        .map(|p| p["containerPort"].as_u64().unwrap())
        .unwrap();
    assert_eq!(named_port, u64::from(listen));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(text(&get["path"]), path, "{probe}");
        assert_eq!(text(&get["port"]), "http", "{probe}");
    }
    // every *_FILE names a file the Secret volume provides
    let mount = mount_of("secrets");
    let provided: Vec<String> = secret["stringData"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(text)
        .collect();
    for (var, path) in env.iter().filter(|(k, _)| k.ends_with("_FILE")) {
        let file = path
            .strip_prefix(&format!("{mount}/"))
            .unwrap_or_else(|| panic!("{var}={path} is not under {mount}"));
        assert!(
            provided.iter().any(|p| p == file),
            "{var}: the Secret has no `{file}`"
        );
    }
    assert!(
        !manifest.contains(DEFAULT_HASH_KEY),
        "the built-in public key"
    );
}

#[test]
fn the_build_context_holds_what_the_build_needs() {
    let ignore =
        std::fs::read_to_string(Path::new(ROOT).join(".dockerignore")).expect(".dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches('/').trim_end_matches('/'))
        .collect();
    assert!(
        patterns.contains(&"target"),
        "target/ stays out of the context"
    );
    // Everything `include_str!` and cargo read at build time stays in.
    for needed in ["Cargo.toml", "Cargo.lock", "src", "config", "lua", "bench"] {
        assert!(
            !patterns
                .iter()
                .any(|p| *p == needed || *p == "*" || *p == "**"),
            ".dockerignore excludes {needed}"
        );
    }
}

/// The first `curl` of the preferences guide, as written, against a worker started
/// with the compose stack's worker environment (its broker and Redis URLs and its
/// port aside: those name the stack's containers; it still listens beyond loopback)
/// and nothing more: 200, and the set is stored; without the token, 401.
#[tokio::test]
async fn the_preferences_guide_curl_answers_200_with_the_compose_configuration() {
    use testkit::procs::WorkerProc;

    let s = testkit::settings(&testkit::unique("compose-curl"));
    let _cleanup = testkit::Cleanup::new(&s);
    let port = testkit::free_port(None);
    let dir = testkit::temp_dir("compose-curl");
    // the test's names and local URLs, then the stack's worker environment over them
    let mut env: BTreeMap<String, String> = testkit::env::env_for(&s)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("QUOTA_WORKER__HTTP__"))
        .collect();
    for (k, v) in environment(service(&compose(), "worker")) {
        if k != "QUOTA_WORKER__AMQP__URL" && k != "QUOTA_WORKER__REDIS__URL" {
            env.insert(k, interpolated(&v));
        }
    }
    let listen = env
        .get_mut("QUOTA_WORKER__HTTP__LISTEN")
        .expect("compose sets http.listen");
    assert!(listen.starts_with("0.0.0.0:"), "{listen}");
    *listen = format!("0.0.0.0:{port}");
    let mut worker = WorkerProc::spawn_env(
        env!("CARGO_BIN_EXE_quota-worker"),
        &s,
        &dir,
        "compose",
        env.into_iter().collect(),
    );
    let addr = format!("127.0.0.1:{port}");
    testkit::wait_for(
        "the worker ready",
        std::time::Duration::from_secs(30),
        || async { matches!(testkit::http_get(&addr, "/readyz").await, Some((200, _))) },
    )
    .await;

    // the guide's first `sh` block that calls the API, run by the shell as written
    let guide = std::fs::read_to_string(Path::new(ROOT).join("docs/guide/preferences.md")).unwrap();
    let block = guide
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.starts_with("curl -X PUT http://127.0.0.1:9464/v1/recipients/"))
        .expect("the guide's curl")
        .trim_end()
        .replace("http://127.0.0.1:9464", &format!("http://{addr}"));
    let curl = |command: &str| {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("{command} -s -o /dev/null -w '%{{http_code}}'"))
            .env_remove("QW_API_TOKEN")
            .output()
            .expect("bash and curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let code = curl(&block);
    assert_eq!(
        code,
        "200",
        "the guide's curl: {block}\n{}",
        worker.tail(20)
    );
    let token =
        interpolated(&environment(service(&compose(), "worker"))["QUOTA_WORKER__HTTP__API_TOKEN"]);
    let (status, body) = {
        let out = std::process::Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("http://{addr}/v1/recipients/user-42/preferences"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap();
        (status.to_string(), body.to_string())
    };
    assert_eq!(status, "200", "{body}");
    assert!(
        body.replace(' ', "").contains(r#""marketing":false"#),
        "{body}"
    );
    // the same call without the token is refused
    let without: String = block
        .lines()
        .filter(|l| !l.contains("Authorization"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(curl(&without), "401", "{without}");
    worker.stop();
}

/// The Helm chart's `appVersion` is the crate's version, and its PrometheusRule and
/// dashboard read the repository's own files: `files/` holds links to them, not
/// copies (`deploy/helm/check.py` renders the chart and compares the objects too).
#[test]
fn the_helm_chart_is_this_version_and_uses_the_deploy_files() {
    let chart = Path::new(ROOT).join("deploy/helm/quota-worker");
    let meta: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(text(&meta["appVersion"]), env!("CARGO_PKG_VERSION"));
    for (link, target) in [
        ("files/alerts.yml", "deploy/prometheus/alerts.yml"),
        (
            "files/quota-worker.json",
            "deploy/grafana/dashboards/quota-worker.json",
        ),
    ] {
        let path = chart.join(link);
        assert!(
            path.symlink_metadata().unwrap().file_type().is_symlink(),
            "{link} is a link"
        );
        assert_eq!(
            path.canonicalize().unwrap(),
            Path::new(ROOT).join(target).canonicalize().unwrap(),
            "{link} points at {target}"
        );
    }
}
