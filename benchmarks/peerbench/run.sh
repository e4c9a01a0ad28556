#!/usr/bin/env bash
# Run the peer benchmark harness with django-workhorse beside the other queues, in one run.
#
#   bash benchmarks/peerbench/run.sh                      # every peer, N=5000, 3 reps
#   PEERS="workhorse pgqueuer pgbench" REPS=1 N=1000 bash benchmarks/peerbench/run.sh
#   PEER_WORKLOADS=W1,W2,W5 bash benchmarks/peerbench/run.sh   # enqueue workloads only
#
# The harness is benchmarks/peerbench/harness (PEERBENCH_DIR picks another copy).
#
# The harness is copied to a temporary folder; our adapter and its settings are added, and the
# harness's venv table learns a "workhorse" entry (this checkout, installed editable). Every other
# knob (REPS, N, SAMPLES, PGBENCH_S, OUT, ...) is the harness's own.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PEERBENCH_DIR="${PEERBENCH_DIR:-$HERE/harness}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp -r "$PEERBENCH_DIR"/. "$WORK/"
chmod -R u+w "$WORK"
cp "$HERE"/peer_workhorse*.py "$WORK/"
cp -r "$HERE/wbench" "$WORK/"
# asyncpg only for the asyncpg floor (peer_workhorse_floor_asyncpg): our code never imports it.
SPEC="Django==6.1.3 psycopg[binary]==3.3.9 asyncpg==0.32.0 -e $REPO"
# Teach the harness our venv recipe; the atomic variant only changes the producer (W1, W2, W5), the
# keyed variants (a new idempotency key per job) run W1 only.
sed -i "s|^  \[chancy\]=|  [workhorse]=\"\${WORKHORSE_SPEC:-$SPEC}\"\n  [chancy]=|" "$WORK/run_all.sh"
sed -i 's/case "$p" in djtasks_pconn|procrastinate_async) WL="W3";; esac/case "$p" in djtasks_pconn|procrastinate_async) WL="W3";; workhorse_atomic|workhorse_async) WL="W1,W2,W5";; workhorse_keyed*) WL="W1";; workhorse_floor*) WL="W1,W5";; esac/' "$WORK/run_all.sh"
sed -i 's/^venv_for() { case "$1" in /venv_for() { case "$1" in workhorse_*) echo workhorse;; /' "$WORK/run_all.sh"
# PGBENCH_ONLY limits the server's limits to the runs whose label holds it (e.g. "copy").
sed -i 's|^\(      "\$BPY" "\$HERE/pgbench_limits.py" --dsn "\$(dsn pgbench)" --rep "\$rep"\) |\1 --only "${PGBENCH_ONLY:-}" |' "$WORK/run_all.sh"
# PEER_WORKLOADS limits every peer to some workloads (e.g. "W1,W2,W5" to compare enqueue only).
sed -i 's/^    WL="W1,W2,W3,W4,W5"$/    WL="${PEER_WORKLOADS:-W1,W2,W3,W4,W5}"/' "$WORK/run_all.sh"
grep -q '\[workhorse\]=' "$WORK/run_all.sh" && grep -q 'workhorse_atomic|workhorse_async) WL=' "$WORK/run_all.sh" \
  && grep -q -- '--only "${PGBENCH_ONLY:-}"' "$WORK/run_all.sh" \
  && grep -q 'workhorse_\*) echo workhorse' "$WORK/run_all.sh" \
  || { echo "could not patch run_all.sh; has the harness changed?" >&2; exit 1; }
export PEERS="${PEERS:-workhorse workhorse_atomic workhorse_keyed workhorse_keyed_atomic procrastinate djtasks pgqueuer chancy pgbench}"
bash "$WORK/run_all.sh"
