"""Every registered forecaster x every generic check (forecasting/checks.py)."""

import pytest

from forecasting import base, checks

CASES = [(name, check) for name in base.names() for check in checks.yield_checks(base.create(name))]


@pytest.mark.parametrize(("name", "check"), CASES, ids=[f"{n}-{c.__name__}" for n, c in CASES])
def test_check(name, check):
    check(lambda: base.create(name))
