#!/bin/bash
# The soak: three worker processes at a third of their measured ceiling, a fault
# every QW_SOAK_FAULT_EVERY seconds in turn (kill -9 of a worker, broker restart,
# Redis restart from its AOF, every worker-broker connection cut by a proxy, a
# reload by SIGHUP), then every job audited: none lost, no cap exceeded, each
# duplicate explained by a fault RELIABILITY.md names, each worker's RSS and open
# descriptors flat (medians of the first and last quarter within 10 %), Redis memory
# within its bound. It is the `#[ignore]`d scenario tests/faults/soak.rs (module doc
# there); everything it runs is its own (a private RabbitMQ node, redis-server,
# proxy and workers), never the machine's shared broker or Redis.
#
#   bench/soak.sh                                         # the hour: 60 min, a fault every 600 s
#   QW_SOAK_MINUTES=6 QW_SOAK_FAULT_EVERY=60 bench/soak.sh   # short: each of the five once
#
# QW_SOAK_MINUTES       length of the steady run, minutes (default 60)
# QW_SOAK_FAULT_EVERY   seconds between faults (default 600)
# QW_SOAK_SAMPLE        seconds between samples (default 5; each is also printed as a line)
# QW_SOAK_METRICS       seconds between reads of each worker's metrics (default 60): its
#                       outcomes, delays, lane parks and takes, lane prefetch, in flight;
#                       printed and kept in the samples (worker_metrics)
# QW_SOAK_FAULTS        the faults in turn, comma-separated (default
#                       kill9,broker_restart,redis_restart,proxy_cut,reload)
# QW_SOAK_CHUNK         jobs in one chunk of the feed (default: ten seconds of it, at least
#                       10,000; the rolling cap's load is 0.07 x rate / (chunk / 50))
# QW_SOAK_CEILING_JOBS  backlog drained to measure the drain's ceiling (default 20000)
# QW_SOAK_SUSTAINED_SECS  seconds of the soak's own loop offered the drain's ceiling,
#                       to measure what it sustains (default 45); the ceiling is the lower
# QW_WRITE_RELIABILITY=1  also writes docs/soak.svg and the soak's section of
#                         RELIABILITY.md (from the records in target/reliability)
# QW_KEEP_TMP=1         keeps the worker logs (their directory is printed)
#
# Writes target/reliability/soak.json (figures and every sample), soak.svg (the plot)
# and soak.{quick,long}.json (the long form from 60 minutes on). Exits non-zero on any
# violation. Needs /usr/lib/rabbitmq/bin/rabbitmq-server and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
export QW_SOAK_MINUTES=${QW_SOAK_MINUTES:-60}
export QW_SOAK_FAULT_EVERY=${QW_SOAK_FAULT_EVERY:-600}
echo "soak: ${QW_SOAK_MINUTES} min, a fault every ${QW_SOAK_FAULT_EVERY} s" >&2
exec cargo test --release --locked --test faults soak -- --ignored --nocapture
