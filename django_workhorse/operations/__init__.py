"""Operator actions (cancel, purge, redrive), maintenance, statistics and key rotation."""
