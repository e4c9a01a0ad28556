"""Admission at claim (decision 0021): what decides whether a ready job may start now.

``breakers`` holds the circuit breaker's policy (the public ``Breaker``) and the rule of what
counts as a failure; ``recording`` turns finished attempts into breaker transitions; the claim
itself (``sql.claims``) holds or admits jobs by their breaker's row.
"""

from __future__ import annotations
