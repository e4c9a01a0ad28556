#!/usr/bin/env bash
# Our enqueue beside pgqueuer's and beside the drivers' floor, interleaved round by round:
#
#   bash benchmarks/peerbench/enqueue_ab.sh                 # 10 rounds, N=5000
#   ROUNDS=12 N=3000 bash benchmarks/peerbench/enqueue_ab.sh
#
# Each round runs every producer once through W1, W2 and W5 (run.sh's harness; the order rotated
# round by round), and COPY of 1,000 rows for W2's limit. The floors run our enqueue's own
# statements with psycopg (workhorse_floor) and asyncpg (workhorse_floor_asyncpg), prepared, their
# parameters built once. interleaved.py prints medians, quartiles and the ratios round by round;
# the raw results stay in $OUT.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export OUT="${OUT:-${TMPDIR:-/tmp}/peerbench/enqueue-ab-$(date -u +%Y%m%dT%H%M%SZ)}"
export REPS="${ROUNDS:-10}" N="${N:-5000}" PEER_WORKLOADS="W1,W2,W5" PGBENCH_ONLY="COPY" PGBENCH_S="${PGBENCH_S:-4}"
export PEERS="${PEERS:-workhorse workhorse_async pgqueuer workhorse_floor workhorse_floor_asyncpg pgbench}"
bash "$HERE/run.sh"
python3 "$HERE/interleaved.py" "$OUT/results.jsonl" | tee "$OUT/interleaved.md"
