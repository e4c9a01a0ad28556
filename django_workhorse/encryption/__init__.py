"""Payload encryption at rest (decision 0024): the keys of ``WORKHORSE_ENCRYPTION`` and the envelopes.

``cryptography`` is imported only once a configured ``WORKHORSE_ENCRYPTION`` is first used.
"""

from __future__ import annotations

from django_workhorse.encryption.envelope import (
    describe,
    described,
    described_head,
    envelope_key_id,
    is_envelope,
    seal,
    unseal,
)
from django_workhorse.encryption.keys import (
    active_key_id,
    configured_key_ids,
    encrypted_scopes,
    encrypts_all,
    fingerprint_hmac,
    is_configured,
)

__all__ = [
    "active_key_id",
    "configured_key_ids",
    "describe",
    "described",
    "described_head",
    "encrypted_scopes",
    "encrypts_all",
    "envelope_key_id",
    "fingerprint_hmac",
    "is_configured",
    "is_envelope",
    "seal",
    "unseal",
]
