#!/bin/bash
# Alternated A/B of two worker binaries with the same `bench`: each round runs
# mixes (a) and (b) (BENCH_STEPS: others, e.g. "c", all malformed, every job
# dead-lettered), each with its own ceiling right before, for A then B in odd
# rounds and B then A in even ones; then prints every round and the medians.
#
#   bench/ab.sh OLD_WORKER NEW_WORKER [ROUNDS=7] [OUT=target/ab] [JOBS=30000]
#
# BENCH_ARGS adds options to every bench run (e.g. BENCH_ARGS="--redis redis://127.0.0.1:7000"
# for a Redis of one's own); a worker "binary" may be a script that sets variables and
# execs the worker, to compare one setting on and off.
set -euo pipefail
old=$1 new=$2 rounds=${3:-7} out=${4:-target/ab} jobs=${5:-30000} steps=${BENCH_STEPS:-a,b}
bench=${CARGO_TARGET_DIR:-$(dirname "$0")/../target}/release/bench
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    bin=$old; [ "$which" = new ] && bin=$new
    # shellcheck disable=SC2086
    "$bench" --steps "$steps" --jobs "$jobs" --rounds 1 --no-realtime --worker "$bin" \
      --out "$out/$r-$which" ${BENCH_ARGS:-} > "$out/$r-$which.log" 2>&1
  done
done
python3 - "$out" <<'PY'
import glob, json, os, statistics as st, sys
rows = {}
for f in glob.glob(os.path.join(sys.argv[1], '*/bench.json')):
    r, w = os.path.basename(os.path.dirname(f)).split('-')
    for m in json.load(open(f))['mixes']:
        rows[(int(r), w, m['name'])] = m
rounds = sorted({k[0] for k in rows})
for mix in [m for m in ['a-allowed', 'b-zipf', 'c-malformed'] if any(k[2] == m for k in rows)]:
    for w in ['old', 'new']:
        ms = [rows[(r, w, mix)] for r in rounds]
        cpu = [sum(m['cpu_us_per_job']) for m in ms]
        ceil = [sum(m['ceiling_cpu_us_per_msg']) for m in ms]
        each = ' '.join('%.2f' % m['ratio_to_ceiling'] for m in ms)
        print(f"{mix} {w}: {each}"
              f" | median {st.median(m['ratio_to_ceiling'] for m in ms):.3f}"
              f" | by CPU {st.median(c / j for c, j in zip(ceil, cpu)):.3f}"
              f" | CPU/job {st.median(cpu):.1f} us (worker {st.median(m['cpu_us_per_job'][2] for m in ms):.1f},"
              f" Redis {st.median(m['cpu_us_per_job'][1] for m in ms):.1f})")
        print(f"  {mix} {w} worker CPU/job: " + ' '.join('%.2f' % m['cpu_us_per_job'][2] for m in ms))
        print(f"  {mix} {w} Redis CPU/job: " + ' '.join('%.2f' % m['cpu_us_per_job'][1] for m in ms))
    d = [rows[(r, 'new', mix)]['ratio_to_ceiling'] - rows[(r, 'old', mix)]['ratio_to_ceiling'] for r in rounds]
    print(f"  {mix} paired new-old: median {st.median(d):+.3f}, {sum(x > 0 for x in d)} up, {sum(x < 0 for x in d)} down")
PY
