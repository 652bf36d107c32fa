#!/bin/bash
# Start a Redis Cluster of three masters on loopback for the benchmark's
# --redis-cluster option (no persistence, data in a temporary directory), and print
# the option's value. Stop it with: bench/cluster.sh stop [PORT]
#
#   bench/cluster.sh [FIRST_PORT=7301]
set -euo pipefail
first=${2:-${1:-7301}}
ports="$first $((first + 1)) $((first + 2))"
dir=${TMPDIR:-/tmp}/qw-bench-cluster-$first
if [ "${1:-}" = stop ]; then
  for p in $ports; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$dir"
  exit 0
fi
mkdir -p "$dir"
for p in $ports; do
  mkdir -p "$dir/$p"
  (cd "$dir/$p" && redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file nodes.conf --save "" --appendonly no --daemonize yes --logfile log)
done
for p in $ports; do
  until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.1; done
done
redis-cli --cluster create $(for p in $ports; do printf '127.0.0.1:%s ' "$p"; done) \
  --cluster-replicas 0 --cluster-yes >/dev/null
until [ "$(redis-cli -p "$first" cluster info | tr -d '\r' | grep -c 'cluster_state:ok')" = 1 ]; do sleep 0.1; done
echo "--redis-cluster $(for p in $ports; do printf 'redis://127.0.0.1:%s,' "$p"; done | sed 's/,$//')"
