"""Update + forecast time per control period for every series of one market (target <= 200 ms).

    python benchmarks/forecast_speed.py [--market PJM] [--periods 36] [--rate 46]

Uses the replay workload (streams.workload.builder.build_workload) when it is installed, else a synthetic
protocol-like stream: 7 days of per-minute history, then `--periods` 5-minute periods of arrival and
completion records at `--rate` requests/s with 0-8 prefix blocks each. Prices are the bundled series.
Prints the start-up (history) time and the per-period mean / p95 / max.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl

from forecasting.bundle import MarketForecaster
from schemas.policy import History, Observations
from schemas.protocol import CLASSES
from streams.datasets.prices import load_prices

SHARE = (0.3, 0.6, 0.1)


def synthetic(market: str, start: datetime, periods: int, rate: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    minutes = [start - timedelta(days=7) + timedelta(minutes=i) for i in range(7 * 1440)]
    shape = lambda t: 1 + 0.4 * np.sin(2 * np.pi * (t.hour * 60 + t.minute) / 1440)  # noqa: E731
    apm = pl.DataFrame({
        "minute_at": np.repeat(minutes, 3), "request_class": list(CLASSES) * len(minutes),
        "requests": [int(rng.poisson(rate * 60 * s * shape(m))) for m in minutes for s in SHARE],
    })
    periods_at = [start - timedelta(days=7) + timedelta(minutes=5 * i) for i in range(7 * 288)]
    sq = pl.DataFrame({"period_at": np.repeat(periods_at, 3), "request_class": list(CLASSES) * len(periods_at)})
    for col, base in (("input_tokens", 1500.0), ("output_tokens", 250.0)):
        for q, mult in (("p50", 1.0), ("p90", 3.0), ("p99", 6.0)):
            sq = sq.with_columns(pl.Series(f"{col}_{q}", base * mult * rng.lognormal(0, 0.1, len(sq))))
    prices = load_prices(market, [start.year - 1, start.year])
    prices = prices.with_columns(arrived_at=pl.col("published_at"))
    hist = History(apm, sq, prices.filter(pl.col("published_at") <= start))
    obs = []
    for p in range(periods):
        t0 = start + timedelta(minutes=5 * p)
        n = int(rng.poisson(rate * 300))
        at = [t0 + timedelta(seconds=float(s)) for s in np.sort(rng.uniform(0, 300, n))]
        cls = rng.choice(CLASSES, n, p=SHARE)
        blocks = [list(rng.integers(0, 5000, rng.integers(0, 9))) for _ in range(n)]
        arrivals = pl.DataFrame({"event_at": at, "arrived_at": at, "request_class": cls,
                                 "input_tokens": rng.lognormal(7.3, 0.8, n).astype(int), "prefix_block_ids": blocks})
        comp = arrivals.select("event_at", "request_class").with_columns(
            output_tokens=pl.Series(rng.lognormal(5.5, 0.9, n).astype(int)))
        as_of = t0 + timedelta(minutes=5)
        new_prices = prices.filter((pl.col("published_at") > t0) & (pl.col("published_at") <= as_of))
        obs.append(Observations(as_of, p, arrivals, comp, pl.DataFrame(), pl.DataFrame(), new_prices))
    return hist, obs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--market", default="PJM")
    ap.add_argument("--periods", type=int, default=36)
    ap.add_argument("--rate", type=float, default=46.0, help="requests/s (500k per 3 h is ~46)")
    args = ap.parse_args()
    start = datetime(2023, 7, 20, 18, tzinfo=UTC)
    hist, obs = synthetic(args.market, start, args.periods, args.rate)
    mf = MarketForecaster(args.market, horizon_periods=12)
    t = time.perf_counter()
    mf.start(hist, start)
    mf.forecast(start)
    t_start = time.perf_counter() - t
    per = []
    for o in obs:
        t = time.perf_counter()
        mf.update(o)
        out = mf.forecast(o.as_of)
        per.append(time.perf_counter() - t)
    ms = np.array(per) * 1e3
    print(f"market {args.market}: {len(mf.series)} series, {args.periods} periods, "
          f"~{args.rate * 300:.0f} arrivals/period")
    print(f"start (7-day history + first forecast): {t_start:.2f} s")
    print(f"update+forecast per period: mean {ms.mean():.1f} ms, p95 {np.percentile(ms, 95):.1f} ms, "
          f"max {ms.max():.1f} ms (target <= 200 ms)")
    print(f"last period: confidence {out[0].confidence:.2f}, price {out[0].price_usd_mwh.point:.1f} $/MWh")


if __name__ == "__main__":
    main()
