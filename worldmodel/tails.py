"""Tail probabilities of the forward model: per-request TPOT under chunked-prefill interference, the learned
(empirical) TPOT tail shape, and the fluid queue's share of late requests.

The parametric TPOT tail (:func:`tpot_tail`) follows from the decode step, the share of iterations carrying a
prefill chunk and the output-length distribution; the empirical one (:func:`empirical_exceed`) is the shape
self-calibration learned from completions (per-request TPOT / the replica's median TPOT, per class), so tails
the parametric form misses (short outputs stalled by several chunks, node spread) are predicted once observed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: standard-normal quantiles of the output-length quadrature (midpoints of 8 equal-probability bins)
_Z_NODES = (-1.534, -0.887, -0.489, -0.157, 0.157, 0.489, 0.887, 1.534)


def tpot_tail(mixed: tuple[float, float, float], cv: float, out_mean: float, out_cv: float) -> Callable[[float], float]:
    """x (s) -> P(a request's mean TPOT > x) under chunked-prefill interference, over lognormal output lengths.

    A request decoding n tokens sees n - 1 iterations; each carries a prefill chunk of compute c with
    probability q, so its mean TPOT is t + c x Binomial(n - 1, q) / (n - 1) (normal approximation), times a
    step-time spread of CV ``cv`` (nodes, context). The spreads of the output-length nodes are computed once;
    the p99 bisections call the tail many times.

    >>> f = tpot_tail((0.03, 0.2, 0.05), 0.1, 200.0, 0.8)
    >>> round(f(0.04), 3), f(0.5) < 1e-9 < f(0.03)
    (0.5, True)
    """
    t, q, c = mixed
    if t <= 0.0:
        return lambda x: 0.0
    mean = t + q * c
    s2 = math.log1p(out_cv * out_cv)
    mu_n = math.log(max(out_mean, 1.0)) - 0.5 * s2
    scales = []
    for z in _Z_NODES:
        steps = max(math.exp(mu_n + z * math.sqrt(s2)) - 1.0, 1.0)
        scales.append(math.sqrt(q * (1.0 - q) / steps * c * c + (cv * mean) ** 2) * math.sqrt(2.0))
    n = len(_Z_NODES)

    def exceed(x: float) -> float:
        return sum(0.5 * math.erfc((x - mean) / s) for s in scales) / n

    return exceed


def tpot_quantile(
    mixed: tuple[float, float, float], cv: float, out_mean: float, out_cv: float, level: float
) -> float:
    """Quantile `level` (0-1) of requests' mean TPOT (s) under :func:`tpot_tail`, by bisection."""
    t, q, c = mixed
    exceed = tpot_tail(mixed, cv, out_mean, out_cv)
    lo, hi = t * (1.0 - 4.0 * cv), t + c + 4.0 * cv * (t + c)
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        if exceed(mid) > 1.0 - level:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def chunk_mix(rate_per_s: float, t_prefill: float, chunks: float, t_dec: float) -> tuple[float, float, float]:
    """The iterations a replica runs under chunked prefill: (decode step (s), share of iterations carrying a
    prompt chunk (0-1), a chunk's compute (s)), for `rate_per_s` prompts of `chunks` chunks each taking
    `t_prefill` s in all. Time not spent on chunked iterations runs decode-only steps of `t_dec` s."""
    c = t_prefill / max(chunks, 1.0)
    mixed = rate_per_s * max(chunks, 1.0)
    plain = max(1.0 - mixed * (t_dec + c), 0.0) / max(t_dec, 1e-12)
    return t_dec, mixed / max(mixed + plain, 1e-12), c


def fluid_share(q0: float, growth: float, mu: float, wait_s: float, T: float) -> float:
    """Share of the period's arrivals whose fluid queueing delay Q(t)/mu exceeds wait_s (0-1)."""
    if mu <= 0.0:
        return 1.0
    x = mu * wait_s - q0  # backlog growth needed before waits exceed wait_s
    if growth > 0.0:
        return min(max(1.0 - x / (growth * T), 0.0), 1.0)
    if growth < 0.0:
        return min(max(-x / (-growth * T), 0.0), 1.0)
    return 1.0 if x < 0.0 else 0.0


def empirical_exceed(table: Sequence[tuple[float, float]], x: float) -> float:
    """P(ratio > x) from a learned quantile table ((level 0-1, ratio), ...), levels increasing (0-1).

    Linear in the ratio between tabulated quantiles; below the first level linear down to ratio 0 (P = 1);
    above the last, log-linear extrapolation of the exceedance from the last two points.

    Examples
    --------
    >>> t = ((0.5, 1.0), (0.9, 2.0), (0.99, 4.0))
    >>> round(empirical_exceed(t, 2.0), 3), round(empirical_exceed(t, 3.0), 3), empirical_exceed(t, 0.0)
    (0.1, 0.055, 1.0)
    """
    if not table or x <= 0.0:
        return 1.0
    lv = [float(a) for a, _ in table]
    q = [float(b) for _, b in table]
    if x <= q[0]:
        return 1.0 - lv[0] * x / q[0] if q[0] > 0 else 1.0 - lv[0]
    for i in range(1, len(q)):
        if x <= q[i]:
            w = (x - q[i - 1]) / (q[i] - q[i - 1]) if q[i] > q[i - 1] else 1.0
            return 1.0 - (lv[i - 1] + w * (lv[i] - lv[i - 1]))
    if len(q) < 2 or q[-1] <= q[-2]:
        return 0.0
    e1, e2 = 1.0 - lv[-2], 1.0 - lv[-1]
    return e2 * (e2 / e1) ** ((x - q[-1]) / (q[-1] - q[-2]))
