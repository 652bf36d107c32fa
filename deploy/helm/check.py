#!/usr/bin/env python3
"""Checks the Helm chart without a cluster or a helm binary.

Renders and lints deploy/helm/quota-worker with helm-python-sdk (Helm's own Go code,
bound through a C library) with the default values, with every optional part on
(all-on.values.yaml; once with KEDA, once with the HPA instead), with the example's
values and with large numbers and a nameOverride (LARGE), then:

- validates every rendered Kubernetes object with `kubernetes-validate --strict`, and
  the KEDA and Prometheus Operator objects with @kubernetes-models (validate-crds.mjs);
- reads the ConfigMap's TOML back and compares it with the `config` value, type by
  type (whole numbers stay integers);
- runs the rendered ConfigMap's configuration, with the Deployment's environment and
  the Secret's files, through `quota-worker config check --strict`;
- checks the scrape's job against the alerts' under nameOverride, the KEDA
  TriggerAuthentication's parameters, the ServiceAccount, checksum/secret, the NOTES,
  the chart's README, .helmignore and icon;
- checks that the schema and the templates refuse each value that cannot work
  (REFUSED) and take the ones that can;
- checks that the PrometheusRule and the dashboard ConfigMap hold the files of
  deploy/prometheus and deploy/grafana, that KEDA scales on the jobs and lane queues
  and never on the delay ladder, and that the grace period covers the preStop hook
  and worker.shutdown_grace;
- checks that deploy/kubernetes.yaml is the chart rendered with example.values.yaml
  (`--write` renders it again).

Usage: python3 deploy/helm/check.py [--bin target/debug/quota-worker] [--write]
Needs: pip install -r deploy/helm/requirements.txt; (cd deploy/helm && npm ci).
Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

import helm_python as helm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHART = HERE / "quota-worker"
RELEASE = "quota-worker"
NAMESPACE = "default"
EXAMPLE = ROOT / "deploy" / "kubernetes.yaml"
EXAMPLE_HEADER = """\
# quota-worker on Kubernetes, rendered from the Helm chart deploy/helm/quota-worker
# with deploy/helm/example.values.yaml (a Secret of placeholders to replace, and the
# chart's defaults). Generated: do not edit; after a change to the chart run
#   python3 deploy/helm/check.py --write
# (deploy/helm/check.py checks that this file is the chart's rendering). To install,
# prefer the chart itself (docs/guide/deployment.md, "Kubernetes: the Helm chart"); to
# apply this file, replace the placeholders first: kubectl apply -f deploy/kubernetes.yaml
"""
# The kinds kubernetes-validate does not know, validated by validate-crds.mjs.
CUSTOM_GROUPS = ("keda.sh/", "monitoring.coreos.com/")
# Helm's install order, for the kinds the chart makes.
KIND_ORDER = [
    "NetworkPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap", "Service",
    "Deployment", "HorizontalPodAutoscaler", "TriggerAuthentication", "ScaledObject",
    "ServiceMonitor", "PrometheusRule",
]

# The metadata KEDA's RabbitMQ scaler reads (its documentation's parameters): the
# ScaledObject's schema leaves trigger metadata an open map of strings, so a misspelt
# key would pass the schema and be ignored by KEDA.
RABBITMQ_METADATA = {
    "host", "hostFromEnv", "protocol", "queueName", "mode", "value", "activationValue",
    "vhostName", "useRegex", "excludeUnacknowledged", "pageSize", "operation",
    "timeout", "unsafeSsl", "usernameFromEnv", "passwordFromEnv",
}
# The parameters its TriggerAuthentication may give (the same documentation's).
RABBITMQ_AUTH = {"host", "username", "password", "tls", "ca", "cert", "key", "keyPassword"}
# Values an operator with large numbers would write (an OpenShift-range user, a body
# limit of 1 MiB, a dead-letter index of a million, KEDA over TLS), with nameOverride:
# rendered, validated and checked as the shipped sets are.
LARGE = {
    "nameOverride": "notifier",
    "secrets": {"create": True,
                "values": {"amqpUrl": "amqps://worker:x@rabbitmq.prod.svc:5671/prod",
                           "redisUrl": "redis://:x@redis.prod.svc:6379", "hashKey": "h" * 44,
                           "adminToken": "a" * 64, "apiToken": "b" * 64,
                           "redisSentinelUrls": "redis://sentinel-0:26379,redis://sentinel-1:26379"},
                "keys": {"redisSentinelUrls": "redis_sentinel_urls"}},
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000680000,
                           "runAsGroup": 1000680000, "fsGroup": 1000680000},
    "config": {"http": {"listen": "0.0.0.0:9464"},
               "worker": {"max_body_bytes": 1048576, "shutdown_grace": "20s"},
               "console": {"dead_index": 1000000},
               "redis": {"sentinel": {"master_name": "mymaster"}}},
    "terminationGracePeriodSeconds": 1000000,
    "serviceMonitor": {"enabled": True},
    "autoscaling": {"keda": {"enabled": True, "queueLength": 1000000, "cooldownPeriod": 86400,
                             "tls": {"enabled": True, "caKey": "ca.crt"}}},
}

failures: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)


def values_of(name: str) -> dict:
    return yaml.safe_load((HERE / name).read_text()) or {}


def render(values: dict) -> dict[str, str]:
    """The chart's templates rendered with `values`, by template path (NOTES.txt left out)."""
    chart = helm.Chart.load(CHART)
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return {k: v for k, v in out.items() if not k.endswith("NOTES.txt")}


def objects_of(rendered: dict[str, str]) -> list[dict]:
    objs = []
    for path in sorted(rendered):
        for doc in yaml.safe_load_all(rendered[path]):
            if doc:
                objs.append(doc)
    return objs


def find(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def lint(values: dict, what: str) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    bad = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    check(not bad and not report.get("errors"), f"helm lint --strict ({what})",
          json.dumps(bad + (report.get("errors") or [])))


def kubernetes_validate(objs: list[dict], what: str, tmp: Path) -> None:
    core = [o for o in objs if not o["apiVersion"].startswith(CUSTOM_GROUPS)]
    files = []
    for i, o in enumerate(core):
        f = tmp / f"{what}-{i}-{o['kind']}.yaml"
        f.write_text(yaml.safe_dump(o))
        files.append(str(f))
    for version in ("1.25.0", "1.37.0"):
        run = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version, *files],
            capture_output=True, text=True,
        )
        check(run.returncode == 0,
              f"kubernetes-validate --strict -k {version} ({what}: "
              f"{', '.join(sorted({o['kind'] for o in core}))})",
              run.stdout + run.stderr)


def custom_validate(objs: list[dict], what: str) -> None:
    custom = [o for o in objs if o["apiVersion"].startswith(CUSTOM_GROUPS)]
    if not custom:
        return
    run = subprocess.run(["node", str(HERE / "validate-crds.mjs")], input=json.dumps(custom),
                         capture_output=True, text=True, cwd=HERE)
    print(run.stdout, end="")
    check(run.returncode == 0, f"@kubernetes-models validation ({what}: "
          f"{', '.join(sorted({o['kind'] for o in custom}))})", run.stderr)


def seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", duration)
    assert m, duration
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m[2]]


def config_check(objs: list[dict], values: dict, binary: Path, what: str, tmp: Path) -> None:
    """The ConfigMap's configuration, read as the pod reads it, passes `config check --strict`."""
    deployment = find(objs, "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmap = next(o for o in find(objs, "ConfigMap")
                     if o["metadata"]["name"] == volumes["config"]["configMap"]["name"])
    secret_name = volumes["secrets"]["secret"]["secretName"]
    secrets = {o["metadata"]["name"]: o for o in find(objs, "Secret")}
    # the chart's Secret, or one as an operator would make it
    data = secrets[secret_name]["stringData"] if secret_name in secrets else {
        "amqp_url": "amqps://worker:secret@rabbitmq:5671/prod",
        "redis_url": "rediss://:secret@redis:6380",
        "hash_key": "k" * 44,
        "admin_token": "a" * 64,
        "api_token": "b" * 64,
    }
    root = tmp / what
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    for var in container["env"]:
        value = var.get("value", "")
        for name, mount in sorted(mounts.items(), key=lambda m: -len(m[1])):
            if value.startswith(mount + "/"):
                value = str(root / name) + value[len(mount):]
                break
        env[var["name"]] = value
    (root / "config").mkdir(parents=True)
    for file, text in configmap["data"].items():
        (root / "config" / file).write_text(text)
    toml_is_the_values(configmap["data"]["config.toml"], what, values)
    (root / "secrets").mkdir()
    for file, text in data.items():
        (root / "secrets" / file).write_text(text + "\n")
    for var, path in env.items():
        if var.endswith("_FILE"):
            check(Path(path).is_file(), f"{var} names a file of the Secret ({what})", path)
    run = subprocess.run([str(binary), "config", "check", "--strict"], env=env,
                         capture_output=True, text=True)
    check(run.returncode == 0, f"quota-worker config check --strict ({what})",
          run.stdout[-2000:] + run.stderr)
    listen = re.search(r'^listen = "(.*)"$', run.stdout, re.M)
    port = container["ports"][0]["containerPort"]
    check(bool(listen) and listen[1].endswith(f":{port}"),
          f"the worker listens on the container's port {port} ({what})",
          listen[1] if listen else run.stdout[-500:])
    grace = pod["terminationGracePeriodSeconds"]
    shutdown = re.search(r'^shutdown_grace = "(.*)"$', run.stdout, re.M)
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["", "0"])
    check(bool(shutdown) and grace > int(pre_stop[-1]) + seconds(shutdown[1]),
          f"terminationGracePeriodSeconds {grace} > preStop {pre_stop[-1]} s "
          f"+ worker.shutdown_grace ({what})", shutdown[1] if shutdown else "")


def chart_config(values: dict) -> dict:
    """The chart's `config` value: values.yaml's under the case's, as Helm merges them."""
    def merge(base, over):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return {k: v for k, v in out.items() if v is not None}
    return merge(yaml.safe_load((CHART / "values.yaml").read_text())["config"], values.get("config", {}))


def typed(x):
    """`x` with the type of every scalar beside it (1 and 1.0 differ)."""
    if isinstance(x, dict):
        return {k: typed(v) for k, v in x.items()}
    if isinstance(x, list):
        return [typed(v) for v in x]
    return (type(x).__name__, x)


def toml_is_the_values(text: str, what: str, values: dict | None = None) -> None:
    """The ConfigMap's TOML reads back as the `config` value, whole numbers as integers."""
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        check(False, f"the ConfigMap's config.toml is TOML ({what})", str(e))
        return
    if values is not None:
        check(typed(parsed) == typed(chart_config(values)),
              f"the ConfigMap's config.toml reads back as the config value, numbers exact ({what})",
              f"{parsed} != {chart_config(values)}")


def same_files(objs: list[dict]) -> None:
    """The PrometheusRule and the dashboard hold the repository's own files."""
    for link, target in [("files/alerts.yml", "deploy/prometheus/alerts.yml"),
                         ("files/quota-worker.json", "deploy/grafana/dashboards/quota-worker.json")]:
        path = CHART / link
        check(path.is_symlink() and path.resolve() == (ROOT / target).resolve(),
              f"{link} is a link to {target}")
    rule = find(objs, "PrometheusRule")[0]
    alerts = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    check(rule["spec"] == alerts, "the PrometheusRule's spec is deploy/prometheus/alerts.yml")
    dashboard = next(o for o in find(objs, "ConfigMap") if "quota-worker.json" in o.get("data", {}))
    expected = json.loads((ROOT / "deploy/grafana/dashboards/quota-worker.json").read_text())
    check(json.loads(dashboard["data"]["quota-worker.json"]) == expected,
          "the dashboard ConfigMap holds deploy/grafana/dashboards/quota-worker.json")
    # grafanaDashboard.datasourceUid: every panel's and variable's data source, nothing else
    other = objects_of(render({"grafanaDashboard": {"enabled": True, "datasourceUid": "mimir"}}))
    text = next(o for o in find(other, "ConfigMap") if "quota-worker.json" in o.get("data", {}))
    moved = json.loads(text["data"]["quota-worker.json"])
    sources = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("datasource"), dict):
                sources.append(node["datasource"].get("uid"))
                node["datasource"]["uid"] = "prometheus"
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(moved)
    check(sources and set(sources) == {"mimir"} and moved == expected,
          f"grafanaDashboard.datasourceUid sets the uid of all {len(sources)} data sources and nothing else",
          str(sorted(set(map(str, sources)))))


def keda_queues(objs: list[dict], values: dict) -> None:
    scaled = find(objs, "ScaledObject")[0]
    queues = [t["metadata"]["queueName"] for t in scaled["spec"]["triggers"]]
    paced = [c for c, s in values["config"].get("channels", {}).items() if "rate" in s]
    want = ["notify.jobs"] + [f"notify.lanes.{c}.{p}" for c in sorted(paced)
                              for p in ("urgent", "normal", "bulk")]
    check(sorted(queues) == sorted(want), "KEDA scales on the jobs queue and every lane",
          f"{queues} != {want}")
    check(not any(q.startswith("notify.delay") for q in queues),
          "KEDA never scales on the delay ladder")
    check(all(t["type"] == "rabbitmq" and t["metadata"]["mode"] == "QueueLength"
              for t in scaled["spec"]["triggers"]), "KEDA's triggers are RabbitMQ QueueLength")
    unknown = {k for t in scaled["spec"]["triggers"] for k in t["metadata"]} - RABBITMQ_METADATA
    check(not unknown, "KEDA's trigger metadata are the RabbitMQ scaler's parameters",
          str(sorted(unknown)))
    check(all(isinstance(v, str) for t in scaled["spec"]["triggers"]
              for v in t["metadata"].values()), "KEDA's trigger metadata are strings")
    auth = find(objs, "TriggerAuthentication")[0]["spec"]
    given = {r["parameter"] for r in auth.get("secretTargetRef", []) + auth.get("env", [])}
    want = {"host", "tls"} | {p for p, k in (("ca", "caKey"), ("cert", "certKey"), ("key", "keyKey"))
                              if values["autoscaling"]["keda"].get("tls", {}).get(k)}
    check(given == want and given <= RABBITMQ_AUTH,
          "KEDA's TriggerAuthentication gives host and, for amqps://, tls, ca, cert and key",
          f"{sorted(given)} != {sorted(want)}")
    deployment = find(objs, "Deployment")[0]["spec"]["template"]["spec"]
    for ref in auth.get("env", []):
        container = next(c for c in deployment["containers"] if c["name"] == ref["containerName"])
        value = next((e.get("value") for e in container["env"] if e["name"] == ref["name"]), None)
        check(ref["parameter"] != "tls" or value == "enable",
              f"KEDA reads {ref['parameter']} from the container's {ref['name']}", str(value))


# Values that cannot work, and what the refusal says: the schema's, or the reason
# the chart gives where a schema cannot compare two values.
REFUSED = [
    ({"replicaCount": "two"}, "schema"),
    ({"autoscaling": {"keda": {"enabled": "yes"}}}, "schema"),
    ({"config": {"http": {"listen": 9464}}}, "schema"),
    ({"config": {"http": {"listen": "127.0.0.1:9464"}}}, "schema"),
    ({"config": {"http": {"listen": "localhost:9464"}}}, "schema"),
    ({"config": {"http": {"listen": "[::1]:9464"}}}, "schema"),
    ({"config": {"worker": {"shutdown_grace": 20}}}, "schema"),
    ({"config": {"worker": {"shutdown_grace": "20 seconds"}}}, "schema"),
    ({"config": {"worker": {"shutdown_grace": "40s"}}}, "must be more than preStopSleepSeconds"),
    ({"terminationGracePeriodSeconds": 25}, "must be more than preStopSleepSeconds"),
    ({"terminationGracePeriodSeconds": "30s"}, "schema"),
    ({"autoscaling": {"keda": {"minReplicaCount": 5, "maxReplicaCount": 2}}}, "is above maxReplicaCount"),
    ({"autoscaling": {"hpa": {"minReplicas": 5, "maxReplicas": 2}}}, "is above maxReplicas"),
    ({"autoscaling": {"keda": {"minReplicaCount": 0}}}, "schema"),
    ({"podDisruptionBudget": {"maxUnavailable": "banana"}}, "schema"),
    ({"podDisruptionBudget": {"maxUnavailable": -1}}, "schema"),
    ({"probes": {"liveness": {"timeoutSeconds": 0}}}, "schema"),
    ({"secrets": {"adminTokens": {"Alice Smith": "k"}}}, "schema"),
    ({"podSecurityContext": {"fsGroup": None}}, "without podSecurityContext.fsGroup"),
    ({"autoscaling": {"keda": {"enabled": True}, "hpa": {"enabled": True}}}, "enable one"),
    ({"replicaCuont": 2}, "schema"),
]


def schema_refuses() -> None:
    chart = helm.Chart.load(CHART)
    for bad, says in REFUSED:
        try:
            chart.render(bad, name=RELEASE, namespace=NAMESPACE)
            refused = ""
        except helm.HelmError as e:
            refused = str(e)
        check(says in refused, f"the chart refuses {json.dumps(bad)} ({says})", refused or "rendered")
    for good in [{"podDisruptionBudget": {"maxUnavailable": "25%"}},
                 {"config": {"http": {"listen": "[::]:9464"}}},
                 {"probes": {"startup": {"enabled": False}, "liveness": {"timeoutSeconds": 5}}}]:
        try:
            chart.render(good, name=RELEASE, namespace=NAMESPACE)
            refused = ""
        except helm.HelmError as e:
            refused = str(e)
        check(not refused, f"the chart takes {json.dumps(good)}", refused)


def operator_expectations(binary: Path) -> None:
    """The alerts' job, the ServiceAccount, a changed Secret, the NOTES."""
    alerts = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    jobs = set(re.findall(r'job="([^"]+)"', alerts))
    for over in [{"nameOverride": "notifier"}, {"fullnameOverride": "nf"}, {}]:
        objs = objects_of(render({**over, "serviceMonitor": {"enabled": True}}))
        endpoint = find(objs, "ServiceMonitor")[0]["spec"]["endpoints"][0]
        set_job = {r.get("replacement") for r in endpoint.get("relabelings", [])
                   if r.get("targetLabel") == "job" and r.get("action") == "replace"}
        check(len(jobs) == 1 and set_job == jobs and "jobLabel" not in find(objs, "ServiceMonitor")[0]["spec"],
              f"the scrape's job is the alerts' {sorted(jobs)} with {json.dumps(over) or 'the defaults'}",
              str(set_job))
    objs = objects_of(render({}))
    account = find(objs, "ServiceAccount")[0]
    pod = find(objs, "Deployment")[0]["spec"]["template"]["spec"]
    check(account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
          and pod["serviceAccountName"] == account["metadata"]["name"],
          "the pods run as the release's ServiceAccount, with no API token mounted")
    sums = []
    for token in ("one", "two"):
        values = copy.deepcopy(values_of("example.values.yaml"))
        values["secrets"]["values"]["apiToken"] = token * 20
        annotations = find(objects_of(render(values)), "Deployment")[0]["spec"]["template"]["metadata"]["annotations"]
        sums.append((annotations.get("checksum/secret"), annotations.get("checksum/config")))
    check(sums[0][0] and sums[0][0] != sums[1][0] and sums[0][1] == sums[1][1],
          "a changed Secret made by the chart changes the pods' checksum/secret (a rollout)", str(sums))
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    check(str(meta.get("icon", "")).startswith(("https://", "data:image/")),
          "Chart.yaml has an icon", str(meta.get("icon")))
    for name in ("README.md", ".helmignore"):
        check((CHART / name).is_file(), f"the chart has its {name}")
    chart = helm.Chart.load(CHART)
    notes = next(v for k, v in chart.render({}, name=RELEASE, namespace=NAMESPACE).items()
                 if k.endswith("NOTES.txt"))
    check("jsonpath='{.data.api_token}'" in notes and "base64 -d" in notes,
          "NOTES say how to read the API token from the Secret", notes[-800:])
    created = next(v for k, v in chart.render(values_of("example.values.yaml"), name=RELEASE,
                                              namespace=NAMESPACE).items() if k.endswith("NOTES.txt"))
    check("jsonpath='{.data.api_token}'" in created, "... also when the chart made the Secret")


def example_text() -> str:
    rendered = render(values_of("example.values.yaml"))
    docs = []
    for path, text in rendered.items():
        for doc in re.split(r"^---\s*$", text, flags=re.M):
            body = doc.strip()
            if body and yaml.safe_load(body):
                kind = yaml.safe_load(body)["kind"]
                docs.append((KIND_ORDER.index(kind), path, body))
    docs.sort()
    return EXAMPLE_HEADER + "".join(f"---\n# Source: {p}\n{b}\n" for _, p, b in docs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=str(ROOT / "target/debug/quota-worker"),
                        help="the quota-worker binary (default target/debug/quota-worker)")
    parser.add_argument("--write", action="store_true", help="render deploy/kubernetes.yaml again")
    args = parser.parse_args()
    if args.write:
        EXAMPLE.write_text(example_text())
        print(f"wrote {EXAMPLE.relative_to(ROOT)}")
        return 0
    binary = Path(args.bin)
    if not binary.is_file():
        print(f"no binary at {binary}: build it (cargo build --bin quota-worker)", file=sys.stderr)
        return 1
    all_on = values_of("all-on.values.yaml")
    hpa = copy.deepcopy(all_on)
    hpa["autoscaling"] = {"keda": {"enabled": False}, "hpa": {"enabled": True}}
    cases = [("defaults", {}), ("all-on", all_on), ("all-on-hpa", hpa),
             ("example", values_of("example.values.yaml")), ("large", LARGE)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for what, values in cases:
            print(f"--- {what}")
            lint(values, what)
            objs = objects_of(render(values))
            print(f"     rendered: {', '.join(o['kind'] for o in objs)}")
            kubernetes_validate(objs, what, tmp)
            custom_validate(objs, what)
            config_check(objs, values, binary, what, tmp)
        print("--- the parts made from the repository's files")
        same_files(objects_of(render(all_on)))
        keda_queues(objects_of(render(all_on)), all_on)
        kinds = {o["kind"] for o in objects_of(render(hpa))}
        check("HorizontalPodAutoscaler" in kinds and "ScaledObject" not in kinds,
              "autoscaling.hpa makes an HPA and no ScaledObject")
        default_kinds = sorted(o["kind"] for o in objects_of(render({})))
        check(default_kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service",
                                "ServiceAccount"],
              "the defaults make a Deployment, its ConfigMap, a Service, a PDB and a ServiceAccount",
              str(default_kinds))
        print("--- what an operator expects of the objects")
        operator_expectations(binary)
        print("--- values.schema.json")
        schema_refuses()
        print("--- deploy/kubernetes.yaml")
        check(EXAMPLE.read_text() == example_text(),
              "deploy/kubernetes.yaml is the chart's rendering (python3 deploy/helm/check.py --write)")
    print(f"{len(failures)} failed" if failures else "every check passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
