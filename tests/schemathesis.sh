#!/usr/bin/env bash
# Schemathesis against a running worker: it reads /v1/openapi.json, generates requests
# from it (valid and invalid ones) for every operation, and checks that the server
# answers what the document says (`--checks all`): a request the document allows is
# not refused, one it forbids is not accepted, every answer matches its schema. Any
# finding fails. The worker is target/debug/quota-worker (build it first), on the
# machine's Redis (127.0.0.1:6379) and RabbitMQ (127.0.0.1:5672), with every key and
# broker name in a namespace of this run's own, removed when it ends.
#
# The phases are `examples` and `fuzzing` (random requests, bounded by
# SCHEMATHESIS_EXAMPLES an operation). Arguments after the options are passed on:
# `tests/schemathesis.sh --phases examples,coverage,fuzzing,stateful` runs every
# phase, Schemathesis' default, which finds nothing either but takes five minutes
# or so here (its `coverage` phase sends some 4,000 requests, one at a time).
#
#   tests/schemathesis.sh            # 100 examples an operation (about a minute)
#   SCHEMATHESIS_EXAMPLES=20 tests/schemathesis.sh
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.32.5
examples=${SCHEMATHESIS_EXAMPLES:-100}
bin=target/debug/quota-worker
[ -x "$bin" ] || { echo "$bin is not built (cargo build)" >&2; exit 2; }
if ! schemathesis --version 2>/dev/null | grep -qx "schemathesis, version $version"; then
  echo "installing schemathesis $version"
  python3 -m pip install -q "schemathesis==$version"
fi

ns="qw-schemathesis-$$"
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$dir/worker.toml" <<EOF
[amqp]
url = "amqp://guest:guest@127.0.0.1:5672/%2f"
jobs_exchange = "$ns.jobs"
jobs_queue = "$ns.jobs"
dispatch_exchange = "$ns.dispatch"
dispatch_queue_prefix = "$ns.dispatch."
dead_exchange = "$ns.dead"
dead_queue = "$ns.dead"
delay_prefix = "$ns.delay"

[redis]
url = "redis://127.0.0.1:6379"
key_prefix = "$ns"
hash_key = "$token-hash"

[http]
listen = "127.0.0.1:$port"
api_token = "$token"

[lanes]
exchange = "$ns.lanes"
queue_prefix = "$ns.lanes."

[feedback]
exchange = "$ns.feedback"
queue = "$ns.feedback"
EOF

worker=""
# The run's queues and exchanges (names from rabbitmqctl, deleted through AMQP with
# pika, which `.ci/run`'s tools install) and Redis keys.
cleanup() {
  local status=$?
  if [ -n "$worker" ]; then
    kill -TERM "$worker" 2>/dev/null || true
    wait "$worker" 2>/dev/null || true
  fi
  redis-cli -h 127.0.0.1 --scan --pattern "$ns:*" | xargs -r redis-cli -h 127.0.0.1 del >/dev/null || true
  local queues exchanges
  queues=$(rabbitmqctl -q list_queues name 2>/dev/null | grep "^$ns\." || true)
  exchanges=$(rabbitmqctl -q list_exchanges name 2>/dev/null | grep "^$ns\." || true)
  if [ -n "$queues$exchanges" ]; then
    QUEUES="$queues" EXCHANGES="$exchanges" python3 -c '
import os, pika
conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2f"))
ch = conn.channel()
for q in os.environ["QUEUES"].split():
    ch.queue_delete(q)
for x in os.environ["EXCHANGES"].split():
    ch.exchange_delete(x)
conn.close()
' || echo "left on the broker (no pika?): $queues $exchanges" >&2
  fi
  rm -rf "$dir"
  exit "$status"
}
trap cleanup EXIT

"$bin" run --config "$dir/worker.toml" >"$dir/worker.log" 2>&1 &
worker=$!
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  kill -0 "$worker" 2>/dev/null || { cat "$dir/worker.log" >&2; exit 1; }
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || { echo "worker not ready" >&2; cat "$dir/worker.log" >&2; exit 1; }

# from the run's directory, where Schemathesis keeps its cache (removed at the end)
cd "$dir"
schemathesis run "http://127.0.0.1:$port/v1/openapi.json" \
  --checks all \
  --max-examples "$examples" \
  --phases examples,fuzzing \
  --header "Authorization: Bearer $token" \
  --no-color \
  "$@"
