#!/usr/bin/env python
"""The enqueue workloads of an interleaved peer run, as medians and quartiles, and our ratio to
pgqueuer and to the drivers' floor round by round.

    python benchmarks/peerbench/interleaved.py RESULTS.jsonl [--ours workhorse] [--peer pgqueuer]

``enqueue_ab.sh`` makes the run: every round runs each producer once, the order rotated round by
round, so a slow minute falls on one round of each, and a ratio is taken between two runs of the
same round (paired), not between two medians. Reported per workload: each producer's jobs/s as the
median and its quartiles over the rounds; then ``ours / peer`` and ``ours / floor`` round by round,
their median, quartiles and how many rounds were above 1; for W2, ours against COPY (the server's
bulk limit, ``pgbench_limits.py``). Standard library only (it runs in any venv).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# (workload, the figure bench.py records, what the table calls it)
METRICS = (
    ("W1", "jobs_per_s", "W1: one job per transaction"),
    ("W2", "jobs_per_s", "W2: 500 jobs per call"),
    ("W5", "replays_per_s", "W5: replays of one key"),
    ("W5", "race_attempts_per_s", "W5: 8 producers racing over 100 keys"),
)
FLOORS = ("workhorse_floor", "workhorse_floor_asyncpg")
COPY = ("pgbench (limit)", "L-b insert1000 COPY (psycopg)")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """First quartile, median, third quartile (inclusive method; one value is its own quartiles)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def by_round(records: list[dict], peer: str, workload: str, key: str) -> dict[int, float]:
    """``peer``'s figure ``key`` of ``workload``, by round (failed runs left out)."""
    found: dict[int, float] = {}
    for record in records:
        mine = record.get("peer") == peer and record.get("workload") == workload and record.get(key) is not None
        if mine and "error" not in record and record.get("ok", True) is not False:
            found[record["rep"]] = float(record[key])
    return found


def figure(values: list[float], digits: int = 0) -> str:
    q1, q2, q3 = quartiles(values)
    return f"**{q2:,.{digits}f}** [{q1:,.{digits}f}-{q3:,.{digits}f}]"


def ratio_cell(ours: dict[int, float], other: dict[int, float]) -> str:
    rounds = sorted(set(ours) & set(other))
    if not rounds:
        return "-"
    ratios = [ours[r] / other[r] for r in rounds]
    above = sum(ratio > 1 for ratio in ratios)
    return f"{figure(ratios, 2)}, above 1 in {above}/{len(ratios)}"


def report(records: list[dict], ours: str, peer: str) -> str:
    present = {record.get("peer") for record in records}
    producers = [ours, *[f"{ours}_async"] * (f"{ours}_async" in present), peer, *FLOORS]
    lines = [
        f"Rounds: {len({r['rep'] for r in records if 'rep' in r})}. Figures: median [first-third quartile] "
        "over the rounds; ratios are taken round by round.",
        "",
        "| workload | " + " | ".join(producers) + f" | {ours} / {peer} | {ours} / psycopg floor | vs COPY |",
        "|---" * (len(producers) + 4) + "|",
    ]
    copy = by_round(records, COPY[0], COPY[1], "jobs_per_s")
    for workload, key, label in METRICS:
        rounds = {producer: by_round(records, producer, workload, key) for producer in producers}
        cells = [figure(list(found.values())) if found else "-" for found in rounds.values()]
        against_copy = ratio_cell(rounds[ours], copy) if workload == "W2" and copy else ""
        lines.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {ratio_cell(rounds[ours], rounds[peer])} | {ratio_cell(rounds[ours], rounds[FLOORS[0]])}"
            + f" | {against_copy} |"
        )
    if copy:
        lines += ["", f"COPY of 1,000 rows per statement (psycopg), jobs/s: {figure(list(copy.values()))}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--ours", default="workhorse")
    parser.add_argument("--peer", default="pgqueuer")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    print(report(records, args.ours, args.peer))


if __name__ == "__main__":
    main()
