"""The audit record's key: one decision id function for the worker, the replay and the audit sink."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

from schemas.timestamps import ts_to_wire


def decision_id(policy: str, markets: Sequence[str], period_start: datetime) -> str:
    """Stable id of one decision: the first 32 hex chars of sha256("policy|m1,m2|period_start").

    A decision re-made after a crash gets the same id, so the audit log keeps one row.

    >>> from datetime import UTC
    >>> decision_id("production", ("PJM",), datetime(2023, 7, 1, tzinfo=UTC))[:12]
    '50bef902af38'
    """
    text = f"{policy}|{','.join(markets)}|{ts_to_wire(period_start)}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]
