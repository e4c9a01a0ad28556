"""Operator actions (cancel, purge, redrive), maintenance and statistics."""
