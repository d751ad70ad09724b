"""Every registered forecaster x every generic check (forecasting/checks.py)."""

import pytest

from forecasting import base, checks

CASES = [(name, check) for name in base.names() for check in checks.yield_checks(base.create(name))]
SLOW = {("pool", "check_no_leakage")}  # about 5 s: the pool refits every member at each cut


@pytest.mark.parametrize(("name", "check"), [
    pytest.param(n, c, id=f"{n}-{c.__name__}", marks=[pytest.mark.slow] if (n, c.__name__) in SLOW else [])
    for n, c in CASES
])
def test_check(name, check):
    check(lambda: base.create(name))
