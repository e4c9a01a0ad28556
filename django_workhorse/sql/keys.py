"""SQL fragments shared by the statements that decide who owns a key."""

from __future__ import annotations

# Whether a binding (joined with its job) owns nothing any more, so the next request may take the
# key over: idempotency and throttle keys once their time is up, unique keys once their job is
# terminal, debounce keys once both hold (debounce keeps its key one window past the scheduled run).
_TERMINAL = "('succeeded', 'dead', 'cancelled')"
_FREE = f"""CASE binding.mode
    WHEN 'unique' THEN job.status IN {_TERMINAL}
    WHEN 'debounce' THEN job.status IN {_TERMINAL} AND binding.expires_at <= {{now}}
    ELSE binding.expires_at <= {{now}} END"""
# Where the bound job is, for debounce: 'open' (queued, never started, window open: replaceable),
# 'due' (queued, never started, window elapsed: a worker is about to take it) or 'started'.
_JOB_STATE = """CASE WHEN job.status <> 'queued' OR job.attempt > 0 THEN 'started'
    WHEN job.run_at > {now} THEN 'open' ELSE 'due' END"""
_BINDING_COLUMNS = "binding.job_id, binding.mode, binding.request_digest, binding.field_digests, {free}, {state}"
