"""Handler outcomes: what a handler raises to say what happens next (snooze, retry, cancel, fail)."""
