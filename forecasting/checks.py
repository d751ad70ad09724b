"""Generic checks every registered forecaster must pass (river's `checks/` idea).

`yield_checks(name)` yields (check_name, callable(factory)) pairs; tests/forecasting/test_checks.py runs every
registered forecaster through every check. Data are synthetic hourly series with daily and weekly seasons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import numpy as np

from forecasting.base import Forecaster
from forecasting.forecast import Forecast

T0 = datetime(2024, 1, 1, tzinfo=UTC)
HOUR_US = 3_600_000_000


def synthetic(n: int = 840, seed: int = 0, noise: float = 3.0, shift_at: int | None = None,
              shift: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hourly series from `T0`: 50 + daily and weekly sines + Gaussian noise (sd `noise`), optionally a level
    shift of `shift` from step `shift_at`. Returns (y, event_us, arrived_us) with arrival at interval end."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = 50 + 10 * np.sin(2 * np.pi * t / 24) + 4 * np.sin(2 * np.pi * t / 168) + rng.normal(0, noise, n)
    if shift_at is not None:
        y[shift_at:] += shift
    ev = int(T0.timestamp() * 1e6) + t * HOUR_US
    return y, ev, ev + HOUR_US


def _fit(f: Forecaster, data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Forecaster:
    return f.update_many(*data)


def _same(a: Forecast, b: Forecast) -> bool:
    arrays = ("step_at_us", "point", "lo80", "hi80", "lo95", "hi95", "known")
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays) and (
        a.model, a.confidence) == (b.model, b.confidence)


AS_OF = T0 + timedelta(hours=800)


def check_input_not_mutated(factory: Callable[[], Forecaster]) -> None:
    data = synthetic()
    before = [d.copy() for d in data]
    _fit(factory(), data).forecast(24, AS_OF)
    assert all(np.array_equal(a, b) for a, b in zip(before, data, strict=True))


def check_clone_unfitted(factory: Callable[[], Forecaster]) -> None:
    f = _fit(factory(), synthetic())
    f.forecast(24, AS_OF)
    c = f.clone()
    assert type(c) is type(f) and c.n_observations == 0 and c._params() == f._params()
    try:
        c.forecast(24, AS_OF)
    except ValueError:
        return
    raise AssertionError("a clone forecast without any observation")


def check_same_seed_same_output(factory: Callable[[], Forecaster]) -> None:
    a = _fit(factory(), synthetic()).forecast(24, AS_OF)
    b = _fit(factory(), synthetic()).forecast(24, AS_OF)
    assert _same(a, b)


def check_horizon_length(factory: Callable[[], Forecaster]) -> None:
    f = _fit(factory(), synthetic())
    for h in (1, 7, 24, 60):
        fc = f.forecast(h, AS_OF)
        assert len(fc) == h and len(fc.point) == h
        assert fc.step_at_us[0] == int(AS_OF.timestamp() * 1e6) // HOUR_US * HOUR_US


def check_interval_order(factory: Callable[[], Forecaster]) -> None:
    fc = _fit(factory(), synthetic()).forecast(48, AS_OF)
    assert np.all(fc.lo95 <= fc.lo80) and np.all(fc.lo80 <= fc.point) and np.all(fc.point <= fc.hi80)
    assert np.all(fc.hi80 <= fc.hi95) and 0.0 <= fc.confidence <= 1.0


def check_no_leakage(factory: Callable[[], Forecaster]) -> None:
    """Perturbing every observation that arrived after t leaves the forecast as of t identical, also when the
    forecaster had first forecast at a later instant (its state then reflected the perturbed data)."""
    y, ev, arr = synthetic()
    t = AS_OF - timedelta(hours=100)
    t_us = int(t.timestamp() * 1e6)
    bent = np.where(arr > t_us, y * 3 + 100, y)
    a, b = _fit(factory(), (y, ev, arr)), _fit(factory(), (bent, ev, arr))
    assert _same(a.forecast(24, t), b.forecast(24, t))
    a2, b2 = _fit(factory(), (y, ev, arr)), _fit(factory(), (bent, ev, arr))
    a2.forecast(24, AS_OF), b2.forecast(24, AS_OF)
    assert _same(a2.forecast(24, t), b2.forecast(24, t))


CHECKS = (check_input_not_mutated, check_clone_unfitted, check_same_seed_same_output, check_horizon_length,
          check_interval_order, check_no_leakage)


def yield_checks(forecaster: Forecaster) -> Iterator[Callable[[Callable[[], Forecaster]], None]]:
    """The checks that apply to `forecaster` (the oracle reads the future by design: no leakage check)."""
    for check in CHECKS:
        if check is check_no_leakage and forecaster.oracle:
            continue
        yield check
