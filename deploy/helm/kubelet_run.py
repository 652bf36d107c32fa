#!/usr/bin/env python3
"""Runs the chart's rendered pod as a kubelet would, against the local RabbitMQ and Redis.

For the chart's defaults and each shipped value set, renders the chart, takes the
Deployment's pod and its worker container, and starts the worker binary the way the
kubelet and the container runtime start it:

- each Secret and ConfigMap volume written as the kubelet writes it (an emptyDir-like
  directory of mode 0777 holding a timestamped directory, the `..data` link and one
  link per key; every file owned by root with the volume's `defaultMode`, or an item's
  `mode`); with the pod's `fsGroup`, every file and directory handed to that group and
  given its read bits (0440, directories also setgid and 0110), as SetVolumeOwnership
  does; an `emptyDir` is a directory of mode 0777 (group `fsGroup` and 0660 when set);
- a mount namespace (`unshare --mount --pid --fork`): the container's root is an
  overlay of the host's root made read-only when `readOnlyRootFilesystem` is true, with
  its own /proc (the worker is PID 1 of its PID namespace, as in a container), a small
  /dev, the kubelet's /etc/hosts (the services' hosts of the Secret's URLs mapped to
  127.0.0.1), the binary where the image has it (/usr/local/bin/quota-worker), and each
  volumeMount bound at its mountPath (read-only where it says so, and always for
  Secrets and ConfigMaps);
- the process under the pod's (or the container's) `runAsUser`/`runAsGroup`, with the
  supplementary group `fsGroup` (and `supplementalGroups`), `no_new_privs` for
  `allowPrivilegeEscalation: false` and no capability for `drop: [ALL]` (setpriv);
- the environment of a container: the image's (its PATH and the Dockerfile's ENV), the
  kubelet's (HOSTNAME, the Kubernetes service's variables, the service links of the
  release's Service), then the container's `env` exactly as rendered ($(VAR) expanded;
  secretKeyRef, configMapKeyRef and fieldRef resolved); the image's ENTRYPOINT with the
  container's args.

The run's names are its own: the values set every queue, exchange and the Redis key
prefix to a prefix of the run (and http.listen to a free port), and everything with
that prefix is deleted at the end. It passes when the startup and readiness probes'
GET /readyz answer 200 within the budget the probes give, the liveness probe's /healthz
answers 200, the container writes nowhere but its emptyDirs, a published job is
dispatched, and, with 1,000 SMS jobs published just before the stop (held in their
lanes where sms is paced), after the preStop hook (run in the container) and SIGTERM
the worker exits 0 inside terminationGracePeriodSeconds counted from the hook's start,
with nothing left unacknowledged and every one of those jobs dispatched once or back
in its queue.

Usage (as root, on Linux): python3 deploy/helm/kubelet_run.py [--bin target/debug/quota-worker]
Needs what check.py needs, pika (requirements.txt), setpriv, unshare and nsenter
(util-linux), rabbitmqctl and redis-cli, RabbitMQ on 127.0.0.1:5672 (guest/guest) and
Redis on 127.0.0.1:6379. Exit status 0 when every run passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check import RELEASE, NAMESPACE, ROOT, find, objects_of, render, values_of  # noqa: E402

DOCKERFILE = ROOT / "Dockerfile"
# The PATH of debian:bookworm-slim, the image's base.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
# Where the run's Secret points the worker: service names, resolved by the pod's
# /etc/hosts to 127.0.0.1 (no TLS here: amqp:// and redis:// on the plain ports).
BROKER_HOST = "rabbitmq.prod.svc"
REDIS_HOST = "redis.prod.svc"
POD_NAME = "quota-worker-7d9f8b6c5d-x2k4q"
CLUSTER_IP = "10.96.23.17"

failures: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> bool:
    print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail and not ok else ""),
          flush=True)
    if not ok:
        failures.append(what)
    return ok


# ---------------------------------------------------------------------------- values

def merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def run_values(values: dict, ns: str, port: int) -> dict:
    """`values` with every name of the worker's topology and keys under `ns`."""
    names = {
        "amqp": {"jobs_exchange": f"{ns}.jobs", "jobs_queue": f"{ns}.jobs",
                 "dispatch_exchange": f"{ns}.dispatch", "dispatch_queue_prefix": f"{ns}.dispatch.",
                 "dead_exchange": f"{ns}.dead", "dead_queue": f"{ns}.dead",
                 "delay_prefix": f"{ns}.delay"},
        "feedback": {"exchange": f"{ns}.feedback", "queue": f"{ns}.feedback"},
        "lanes": {"exchange": f"{ns}.lanes", "queue_prefix": f"{ns}.lanes."},
        "redis": {"key_prefix": ns},
        "http": {"listen": f"0.0.0.0:{port}"},
    }
    return merged(values, {"config": names})


def local_url(url: str) -> str:
    """An operator's URL (or comma-separated list of URLs) pointed at this machine's
    servers, by their service names."""
    if "," in url:
        return ",".join(local_url(u.strip()) for u in url.split(","))
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme.startswith("amqp"):
        return f"amqp://guest:guest@{BROKER_HOST}:5672/%2f"
    if scheme.startswith("redis"):
        return f"redis://{REDIS_HOST}:6379"
    return url


def secret_data(objs: list[dict], name: str) -> dict[str, str]:
    """The Secret `name` as the cluster holds it: the chart's (its URLs pointed here),
    or the one the deployment guide's `kubectl create secret` makes."""
    for o in find(objs, "Secret"):
        if o["metadata"]["name"] == name:
            data = dict(o.get("stringData") or {})
            for k, v in (o.get("data") or {}).items():
                data[k] = base64.b64decode(v).decode()
            return {k: local_url(v) for k, v in data.items()}
    return {
        "amqp_url": local_url("amqps://"),
        "redis_url": local_url("rediss://"),
        "hash_key": base64.b64encode(secrets.token_bytes(32)).decode(),
        "admin_token": secrets.token_hex(32),
        "api_token": secrets.token_hex(32),
    }


# ----------------------------------------------------------------------------- image

def image() -> tuple[dict[str, str], list[str], str]:
    """The runtime stage of the Dockerfile: its ENV, ENTRYPOINT and USER."""
    stage = DOCKERFILE.read_text().split("\nFROM ")[-1]
    env = {"PATH": IMAGE_PATH}
    for m in re.finditer(r"^ENV (\S+?)=(\S+)$", stage, re.M):
        env[m[1]] = m[2]
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.M)[1])
    user = re.search(r"^USER (\S+)$", stage, re.M)[1]
    return env, entrypoint, user


# --------------------------------------------------------------------------- volumes

def write_projection(vol: Path, files: dict[str, tuple[str, int]]) -> None:
    """Files as the kubelet's AtomicWriter lays them out in a volume directory."""
    vol.mkdir(parents=True)
    os.chmod(vol, 0o777)
    ts = vol / "..2026_01_01_00_00_00.000000001"
    ts.mkdir()
    os.chmod(ts, 0o755)
    for path, (text, mode) in files.items():
        f = ts / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        os.chmod(f, mode)
    (vol / "..data").symlink_to(ts.name)
    for top in sorted({p.split("/")[0] for p in files}):
        (vol / top).symlink_to(f"..data/{top}")


def projected_files(source: dict, data: dict[str, str]) -> dict[str, tuple[str, int]]:
    mode = source.get("defaultMode", 0o644)
    if "items" in source:
        return {i["path"]: (data[i["key"]], i.get("mode", mode)) for i in source["items"]}
    return {k: (v, mode) for k, v in data.items()}


def set_ownership(vol: Path, fs_group: int | None, read_only: bool) -> None:
    """SetVolumeOwnership: group fsGroup, read (or read-write) bits for it; symlinks left."""
    if fs_group is None:
        return
    for path in [vol, *vol.rglob("*")]:
        if path.is_symlink():
            continue
        os.lchown(path, -1, fs_group)
        mode = path.stat().st_mode & 0o7777
        mask = 0o440 if read_only else 0o660
        if path.is_dir():
            mask |= 0o2000 | 0o110
        os.chmod(path, mode | mask)


def make_volumes(pod: dict, objs: list[dict], secret: dict[str, str], stage: Path,
                 fs_group: int | None) -> dict[str, tuple[Path, bool]]:
    """Each volume of the pod on disk, by name, with whether the kubelet mounts it read-only."""
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in find(objs, "ConfigMap")}
    out = {}
    for v in pod.get("volumes", []):
        vol = stage / "volumes" / v["name"]
        if "secret" in v:
            write_projection(vol, projected_files(v["secret"], secret))
            read_only = True
        elif "configMap" in v:
            write_projection(vol, projected_files(v["configMap"], configmaps[v["configMap"]["name"]]))
            read_only = True
        elif "emptyDir" in v:
            vol.mkdir(parents=True)
            os.chmod(vol, 0o777)
            read_only = False
        else:
            raise SystemExit(f"volume {v['name']}: no kubelet model for {sorted(v)}")
        set_ownership(vol, fs_group, read_only)
        out[v["name"]] = (vol, read_only)
    return out


def describe_volumes(volumes: dict[str, tuple[Path, bool]]) -> str:
    lines = []
    for name, (vol, _) in volumes.items():
        for f in sorted(vol.rglob("*")):
            if f.is_file() and not f.is_symlink():
                st = f.stat()
                lines.append(f"{name}/{f.name} {oct(st.st_mode & 0o7777)} {st.st_uid}:{st.st_gid}")
    return ", ".join(lines)


# ----------------------------------------------------------------------- environment

def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion ($$ escapes; an unknown name stays as written)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def service_links(objs: list[dict]) -> dict[str, str]:
    """The docker-link variables the kubelet gives for each Service of the namespace."""
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
           "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
           "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}
    for svc in find(objs, "Service"):
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ports = svc["spec"]["ports"]
        env[f"{name}_SERVICE_HOST"] = CLUSTER_IP
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        env[f"{name}_PORT"] = f"tcp://{CLUSTER_IP}:{ports[0]['port']}"
        for p in ports:
            proto = p.get("protocol", "TCP")
            base = f"{name}_PORT_{p['port']}_{proto}"
            if p.get("name"):
                env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
            env[base] = f"{proto.lower()}://{CLUSTER_IP}:{p['port']}"
            env[f"{base}_PROTO"] = proto.lower()
            env[f"{base}_PORT"] = str(p["port"])
            env[f"{base}_ADDR"] = CLUSTER_IP
    return env


def container_env(pod: dict, container: dict, objs: list[dict], secret_name: str,
                  secret: dict[str, str], image_env: dict[str, str]) -> dict[str, str]:
    env = dict(image_env)
    env["HOSTNAME"] = POD_NAME
    if pod.get("enableServiceLinks", True):
        env.update(service_links(objs))
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in find(objs, "ConfigMap")}
    fields = {"metadata.name": POD_NAME, "metadata.namespace": NAMESPACE,
              "status.podIP": "127.0.0.1", "spec.nodeName": "node-1",
              "spec.serviceAccountName": pod.get("serviceAccountName", "default")}
    own: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            ref = var["valueFrom"]
            if "secretKeyRef" in ref:
                assert ref["secretKeyRef"]["name"] == secret_name, ref
                value = secret[ref["secretKeyRef"]["key"]]
            elif "configMapKeyRef" in ref:
                value = configmaps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
            elif "fieldRef" in ref:
                value = fields[ref["fieldRef"]["fieldPath"]]
            else:
                raise SystemExit(f"env {var['name']}: no kubelet model for {sorted(ref)}")
        else:
            value = expand(var.get("value", ""), {**env, **own})
        own[var["name"]] = value
    env.update(own)
    return env


# --------------------------------------------------------------------------- the pod

def security(pod: dict, container: dict, image_user: str) -> tuple[int, int, list[int], list[str]]:
    """The uid, gid, supplementary groups and setpriv's options of the container."""
    psc = pod.get("securityContext", {})
    csc = container.get("securityContext", {})
    img_uid, _, img_gid = image_user.partition(":")
    uid = csc.get("runAsUser", psc.get("runAsUser", int(img_uid)))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", int(img_gid or 0)))
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and uid == 0:
        raise SystemExit("runAsNonRoot with user 0: the kubelet refuses to start the container")
    groups = ([psc["fsGroup"]] if "fsGroup" in psc else []) + list(psc.get("supplementalGroups", []))
    opts = [f"--reuid={uid}", f"--regid={gid}"]
    opts += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    if csc.get("allowPrivilegeEscalation") is False:
        opts.append("--no-new-privs")
    if "ALL" in csc.get("capabilities", {}).get("drop", []):
        opts += ["--inh-caps=-all", "--bounding-set=-all"]
    return uid, gid, groups, opts


def pod_script(stage: Path, binary: Path, container: dict,
               volumes: dict[str, tuple[Path, bool]], read_only_root: bool) -> Path:
    """The shell script that builds the container's root in a new mount namespace and
    execs "$@" in it (as PID 1 of the new PID namespace)."""
    q = shlex.quote
    root = stage / "root"
    lines = [
        "set -eu",
        f"mount -t tmpfs -o mode=0755 tmpfs {q(str(stage / 'ovl'))}",
        f"mkdir {q(str(stage / 'ovl/upper'))} {q(str(stage / 'ovl/work'))}",
        f"mount -t overlay overlay -o lowerdir=/,upperdir={stage}/ovl/upper,workdir={stage}/ovl/work {q(str(root))}",
        f"R={q(str(root))}",
        "mount -t proc -o nosuid,nodev,noexec proc \"$R/proc\"",
        "mount -t tmpfs -o nosuid,mode=0755 tmpfs \"$R/dev\"",
        "for d in null zero full random urandom tty; do touch \"$R/dev/$d\"; mount --bind \"/dev/$d\" \"$R/dev/$d\"; done",
        "mkdir \"$R/dev/shm\" && mount -t tmpfs -o nosuid,nodev,noexec tmpfs \"$R/dev/shm\"",
        "mount --rbind /sys \"$R/sys\" && mount -o remount,bind,ro \"$R/sys\"",
        f"mount --bind {q(str(stage / 'hosts'))} \"$R/etc/hosts\"",
        f"mount --bind {q(str(stage / 'hostname'))} \"$R/etc/hostname\"",
        "mkdir -p \"$R/usr/local/bin\" && touch \"$R/usr/local/bin/quota-worker\"",
        f"mount --bind {q(str(binary))} \"$R/usr/local/bin/quota-worker\"",
        "mount -o remount,bind,ro \"$R/usr/local/bin/quota-worker\"",
    ]
    for m in container.get("volumeMounts", []):
        src, ro = volumes[m["name"]]
        if m.get("subPath"):
            src = src / m["subPath"]
        target = '"$R"' + q(m["mountPath"])
        make = "mkdir -p" if src.is_dir() else "touch"
        if not src.is_dir():
            lines.append(f"mkdir -p \"$(dirname {target})\"")
        lines += [f"{make} {target}", f"mount --bind {q(str(src))} {target}"]
        if ro or m.get("readOnly"):
            lines.append(f"mount -o remount,bind,ro {target}")
    if read_only_root:
        lines.append("mount -o remount,ro \"$R\"")
    lines.append("exec chroot \"$R\" \"$@\"")
    script = stage / "pod.sh"
    script.write_text("\n".join(lines) + "\n")
    return script


def child_of(pid: int, timeout: float = 10) -> int:
    """The process `unshare --fork` started (PID 1 of the new PID namespace)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:
            return 0
        if kids:
            return int(kids[0])
        time.sleep(0.02)
    return 0


def http_get(port: int, path: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def probe_port(container: dict, probe: dict) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def startup_budget(container: dict) -> tuple[dict, float]:
    """The probe that decides the container started, and the seconds the kubelet
    gives it before it restarts the container (the startup probe's, else the
    liveness probe's)."""
    probe = container.get("startupProbe") or container["livenessProbe"]
    budget = probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    return probe, budget


# ------------------------------------------------------------------------ the broker

def amqp_channel():
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    return conn, conn.channel()


def queue_counts(ns: str) -> dict[str, tuple[int, int]]:
    out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "--no-table-headers", "name",
                          "messages_ready", "messages_unacknowledged"],
                         capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].startswith(ns + "."):
            counts[parts[0]] = (int(parts[1]), int(parts[2]))
    return counts


def settled_counts(ns: str, within: float) -> dict[str, tuple[int, int]]:
    """The queues' counts once the broker's figures stop moving (they trail the
    settlements by a moment): two reads alike and nothing unacknowledged, or the last
    read after `within` seconds."""
    end = time.monotonic() + within
    last = queue_counts(ns)
    while time.monotonic() < end:
        time.sleep(0.5)
        now = queue_counts(ns)
        if now == last and not any(c[1] for c in now.values()):
            return now
        last = now
    return last


def cleanup(ns: str) -> None:
    """Every queue and exchange named `<ns>.…` and every Redis key `<ns>:…`, deleted."""
    try:
        conn, ch = amqp_channel()
        for q in queue_counts(ns):
            ch.queue_delete(q)
        out = subprocess.run(["rabbitmqctl", "-q", "list_exchanges", "--no-table-headers", "name"],
                             capture_output=True, text=True, check=True).stdout
        for x in out.split():
            if x.startswith(ns + "."):
                ch.exchange_delete(x)
        conn.close()
    except Exception as e:  # noqa: BLE001 - a cleanup reports and goes on
        print(f"     cleanup of the broker's {ns}.*: {e}")
    keys = subprocess.run(["redis-cli", "--scan", "--pattern", f"{ns}:*"],
                          capture_output=True, text=True).stdout.split()
    for i in range(0, len(keys), 500):
        subprocess.run(["redis-cli", "DEL", *keys[i:i + 500]], capture_output=True)


# ----------------------------------------------------------------------------- a run

class Pod:
    """The worker container of one rendered chart, started as the kubelet starts it."""

    def __init__(self, what: str, values: dict, binary: Path, stage: Path):
        self.what = what
        self.ns = f"qwk-{what}-{os.getpid()}-{secrets.token_hex(3)}"
        self.port = free_port()
        self.objs = objects_of(render(run_values(values, self.ns, self.port)))
        deployment = find(self.objs, "Deployment")[0]
        self.pod = deployment["spec"]["template"]["spec"]
        self.container = self.pod["containers"][0]
        self.stage = stage
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.log = stage / "worker.log"
        vols = {v["name"]: v for v in self.pod.get("volumes", [])}
        self.secret_name = next((v["secret"]["secretName"] for v in vols.values() if "secret" in v), "")
        self.secret = secret_data(self.objs, self.secret_name)

    def start(self) -> None:
        image_env, entrypoint, image_user = image()
        uid, gid, groups, opts = security(self.pod, self.container, image_user)
        fs_group = self.pod.get("securityContext", {}).get("fsGroup")
        volumes = make_volumes(self.pod, self.objs, self.secret, self.stage, fs_group)
        print(f"     user {uid}:{gid} groups {groups or 'none'}; files: {describe_volumes(volumes)}")
        env = container_env(self.pod, self.container, self.objs, self.secret_name, self.secret, image_env)
        self.env, self.creds = env, opts
        (self.stage / "hosts").write_text(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"127.0.0.1\t{POD_NAME}\n"
            f"127.0.0.1\t{BROKER_HOST} {REDIS_HOST}\n")
        (self.stage / "hostname").write_text(POD_NAME + "\n")
        for d in ("ovl", "root"):
            (self.stage / d).mkdir()
        read_only = self.container.get("securityContext", {}).get("readOnlyRootFilesystem", False)
        script = pod_script(self.stage, self.binary, self.container, volumes, read_only)
        command = self.container.get("command") or entrypoint
        args = self.container.get("args") if "args" in self.container else []
        argv = [expand(a, env) for a in command + args]
        exe = argv[0] if argv[0].startswith("/") else "/usr/local/bin/" + argv[0]
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "--",
             "/bin/sh", str(script), "/usr/bin/setpriv", *opts, "--",
             "/usr/bin/env", "-i", *[f"{k}={v}" for k, v in env.items()], exe, *argv[1:]],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, cwd="/")
        self.pid = child_of(self.proc.pid)

    def log_tail(self, n: int = 2500) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def wait_ready(self) -> bool:
        probe, budget = startup_budget(self.container)
        readiness = self.container["readinessProbe"]
        port = probe_port(self.container, readiness)
        timeout = readiness.get("timeoutSeconds", 1)
        t0 = time.monotonic()
        while time.monotonic() - t0 < budget:
            if self.proc.poll() is not None:
                return check(False, f"the worker starts ({self.what})",
                             f"exited {self.proc.returncode} after {time.monotonic() - t0:.1f} s:\n"
                             + self.log_tail())
            if http_get(port, readiness["httpGet"]["path"], timeout) == 200:
                check(True, f"GET {readiness['httpGet']['path']} answers 200 after "
                      f"{time.monotonic() - t0:.1f} s, within the {budget:.0f} s the probes give ({self.what})")
                return True
            time.sleep(min(readiness.get("periodSeconds", 10), 0.25))
        return check(False, f"ready within the {budget:.0f} s the probes give ({self.what})",
                     self.log_tail())

    def live(self) -> None:
        probe = self.container["livenessProbe"]
        status = http_get(probe_port(self.container, probe), probe["httpGet"]["path"],
                          probe.get("timeoutSeconds", 1))
        check(status == 200, f"liveness GET {probe['httpGet']['path']} answers 200 ({self.what})",
              str(status))

    def in_container(self, *argv: str) -> subprocess.CompletedProcess:
        """`argv` run in the container as its process runs (kubectl exec)."""
        return subprocess.run(
            ["nsenter", f"--target={self.pid}", "--mount", "--pid", "--root", "--wd",
             "/usr/bin/setpriv", *self.creds, "--", "/usr/bin/env", "-i",
             *[f"{k}={v}" for k, v in self.env.items()], *argv],
            capture_output=True, text=True, timeout=60)

    def writes_only_where_allowed(self) -> None:
        """With readOnlyRootFilesystem, the container writes nowhere but its emptyDirs."""
        if not self.container.get("securityContext", {}).get("readOnlyRootFilesystem"):
            return
        scratch = {v["name"] for v in self.pod.get("volumes", []) if "emptyDir" in v}
        paths = dict.fromkeys(["/", "/tmp", "/var/tmp", "/home"], False)
        for m in self.container.get("volumeMounts", []):
            paths[m["mountPath"]] = m["name"] in scratch and not m.get("readOnly")
        for path, writable in paths.items():
            run = self.in_container("/bin/sh", "-c", f"echo x > '{path.rstrip('/')}/.kubelet-run'")
            if writable:
                check(run.returncode == 0, f"the emptyDir {path} can be written ({self.what})", run.stderr)
            else:
                check(run.returncode != 0 and ("Read-only" in run.stderr or "Permission" in run.stderr),
                      f"{path} cannot be written in the container ({self.what})", run.stderr or "written")

    def publish(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        """`quota-worker publish` from outside the pod, to the run's jobs exchange."""
        env = {"PATH": os.environ["PATH"], "QUOTA_WORKER__AMQP__URL": AMQP_URL,
               "QUOTA_WORKER__AMQP__JOBS_EXCHANGE": f"{self.ns}.jobs",
               "QUOTA_WORKER__REDIS__KEY_PREFIX": self.ns}
        return subprocess.run([str(self.binary), "publish", *args], env=env, input=stdin,
                              capture_output=True, text=True)

    def holds_work(self, jobs: int) -> int:
        """`jobs` SMS jobs to as many recipients, published before the stop, so that the
        worker holds some at SIGTERM where sms is paced; the count published."""
        lines = "".join(json.dumps({"id": f"{self.ns}-sms-{i}", "recipient": f"+1555{i:07d}",
                                    "channel": "sms"}) + "\n" for i in range(jobs))
        pub = self.publish("--stdin", stdin=lines)
        check(pub.returncode == 0, f"{jobs} SMS jobs published to {self.ns}.jobs", pub.stderr[-500:])
        return jobs if pub.returncode == 0 else 0

    def takes_a_job(self) -> None:
        job_id = f"{self.ns}-job"
        pub = self.publish("--recipient", "user-42@example.com", "--channel", "email", "--id", job_id)
        if not check(pub.returncode == 0, f"a job published to {self.ns}.jobs", pub.stderr):
            return
        queue = f"{self.ns}.dispatch.email"
        conn, ch = amqp_channel()
        try:
            got = None
            t0 = time.monotonic()
            while got is None and time.monotonic() - t0 < 30 and self.proc.poll() is None:
                method, props, _ = ch.basic_get(queue, auto_ack=True)
                if method:
                    got = props.message_id
                else:
                    time.sleep(0.1)
            check(got == job_id, f"the worker dispatched it to {queue} ({self.what})",
                  f"got {got!r}\n" + self.log_tail())
        finally:
            conn.close()

    def stop(self, held: int) -> None:
        """The kubelet's stop: the preStop hook in the container, then SIGTERM, SIGKILL
        at terminationGracePeriodSeconds from the hook's start. `held`: SMS jobs
        published just before, each of which must end dispatched once or back in a
        queue."""
        grace = self.pod.get("terminationGracePeriodSeconds", 30)
        t0 = time.monotonic()
        hook = self.container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if hook:
            run = self.in_container(*hook)
            check(run.returncode == 0, f"the preStop hook {hook} runs in the container ({self.what})",
                  run.stderr)
        os.kill(self.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=max(grace - (time.monotonic() - t0), 2))
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait()
            check(False, f"the worker exits within terminationGracePeriodSeconds {grace} ({self.what})",
                  self.log_tail())
            return
        took = time.monotonic() - t0
        check(rc == 0, f"the worker exits 0 {took:.1f} s after the preStop hook began, inside "
              f"terminationGracePeriodSeconds {grace} ({self.what})", f"exit {rc}\n{self.log_tail()}")
        counts = settled_counts(self.ns, grace)
        unacked = {q: c for q, c in counts.items() if c[1]}
        check(not unacked, f"nothing left unacknowledged in {self.ns}.* ({self.what})", str(unacked))
        sent = counts.get(f"{self.ns}.dispatch.sms", (0, 0))[0]
        back = sum(c[0] for q, c in counts.items() if q == f"{self.ns}.jobs" or q.startswith(f"{self.ns}.lanes.sms."))
        check(sent + back == held, f"of the {held} SMS jobs, {sent} dispatched and {back} handed back to "
              f"their queues, none lost or sent twice ({self.what})", str(counts))

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            if self.pid:
                os.kill(self.pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()


def run_case(what: str, values: dict, binary: Path) -> None:
    print(f"--- {what}", flush=True)
    with tempfile.TemporaryDirectory(prefix="qw-kubelet-") as tmp:
        pod = Pod(what, values, binary, Path(tmp))
        try:
            pod.start()
            if pod.wait_ready():
                pod.live()
                pod.writes_only_where_allowed()
                pod.takes_a_job()
                pod.stop(pod.holds_work(1000))
        finally:
            pod.kill()
            cleanup(pod.ns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=str(ROOT / "target/debug/quota-worker"),
                        help="the quota-worker binary (default target/debug/quota-worker)")
    parser.add_argument("--only", help="run one value set: defaults, all-on or example")
    args = parser.parse_args()
    binary = Path(args.bin).resolve()
    if not binary.is_file():
        print(f"no binary at {binary}: build it (cargo build --bin quota-worker)", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("run as root: the kubelet's files, mounts and users need it", file=sys.stderr)
        return 1
    cases = [("defaults", {}), ("all-on", values_of("all-on.values.yaml")),
             ("example", values_of("example.values.yaml"))]
    for what, values in cases:
        if args.only in (None, what):
            run_case(what, values, binary)
    print(f"{len(failures)} failed" if failures else "every run passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
