"""`aurelius data list` and `aurelius data window`: what is bundled, and what a window would contain."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from schemas.fleet import MARKETS
from schemas.protocol import PROTOCOL_V1
from streams.datasets.paths import data_dir
from streams.datasets.prices import available_years, load_prices, price_gaps
from streams.datasets.servegen import SLOT_S, load_rate_shape, shape_clients
from streams.datasets.traces import load_azure, load_mooncake
from streams.workload.builder import build_workload


@dataclass(frozen=True)
class Entry:
    """One line of `aurelius data list`."""

    name: str
    span: str
    rows: int
    license: str


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")


def _license(folder: Path, spdx: str) -> str:
    """The SPDX id, checked against the license file shipped in ``folder``."""
    files = sorted(p.name for p in folder.glob("LICENSE*"))
    return f"{spdx} ({files[0]})" if files else f"{spdx} (license file MISSING)"


def bundled() -> list[Entry]:
    """Every bundled data set with its span, rows and license."""

    root = data_dir()
    out = []
    for market in MARKETS:
        df = load_prices(market, available_years(market))
        missing = int(price_gaps(df)["missing_hours"].sum())
        span = f"{_iso(df['interval_start'][0])} .. {_iso(df['interval_end'][-1])}, {missing} h missing"
        name = f"prices/{market} ({df['market_run'][0]}, {df['location'][0]})"
        out.append(Entry(name, span, df.height, _license(root / "prices", "MIT")))
    for kind in ("code", "conv"):
        df = load_azure(kind)
        span = f"{_iso(df['arrived_at'][0])} .. {_iso(df['arrived_at'][-1])}"
        folder = root / "traces" / "azure_llm_2023"
        out.append(Entry(f"traces/azure_llm_2023 {kind}", span, df.height, _license(folder, "CC-BY-4.0")))
    mc = load_mooncake()
    folder = root / "traces" / "mooncake_fast25"
    span = f"0 .. {mc['arrival_ms'][-1] / 1000:.0f} s (relative)"
    out.append(Entry("traces/mooncake_fast25 conversation", span, mc.height, _license(folder, "Apache-2.0")))
    shape, clients = load_rate_shape(), shape_clients()
    span = f"0 .. {shape.height * SLOT_S / 86400:.0f} d (relative, {SLOT_S // 60}-min, {clients} series)"
    out.append(Entry("servegen/language m-large rate", span, shape.height * clients,
                     _license(root / "servegen", "Apache-2.0")))
    for folder, spdx in (("splitwise_perf_model", "MIT"), ("aiconfigurator_silicon", "Apache-2.0")):
        path = root / "calibration" / folder
        rows = sum(pl.read_csv(f, infer_schema_length=0).height for f in sorted(path.glob("*.csv.gz")))
        out.append(Entry(f"calibration/{folder}", "-", rows, _license(path, spdx)))
    return out


def run_list(args: argparse.Namespace) -> int:
    """Print the bundled data sets (name, span, rows, license)."""
    logging.getLogger("streams.datasets.prices").setLevel(logging.ERROR)  # gaps are shown in the span column
    entries = bundled()
    print(f"data directory: {data_dir()}")
    width = max(len(e.name) for e in entries)
    for e in entries:
        print(f"{e.name:<{width}}  {e.rows:>9,}  {e.license:<34}  {e.span}")
    return 0


def _parse_start(text: str | None) -> datetime | None:
    if text is None:
        return None
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def run_window(args: argparse.Namespace) -> int:
    """Print, per market (and year), the window in UTC and market-local time, mean price and requests."""

    markets = [m.strip().upper() for m in args.markets.split(",") if m.strip()]
    years = [int(y) for y in args.years.split(",")] if args.years else [args.year]
    classes = [c.name.value for c in PROTOCOL_V1.classes]
    print(f"{'market':<6} {'year':>4} {'rule':<6} {'window UTC':<38}  {'window market-local':<54}  "
          f"{'mean $/MWh':>10} " + " ".join(f"{c:>8}" for c in classes) + f" {'total':>8}")
    try:
        start = _parse_start(args.start)
        for year in years:
            for market in markets:
                w = build_workload(market, year, rule=args.window_rule, start=start, periods=args.periods,
                                   period_minutes=args.period_minutes, seed=args.seed, source=args.source)
                counts = dict(w.requests["request_class"].value_counts().iter_rows())
                lo, hi = w.window.local()
                utc = f"{_iso(w.window.start)} .. {_iso(w.window.end)}"
                local = f"{lo.isoformat()} .. {hi.isoformat()}"
                per_class = " ".join(f"{counts.get(c, 0):>8}" for c in classes)
                print(f"{market:<6} {year:>4} {w.window.rule:<6} {utc}  {local}  "
                      f"{w.window.mean_price_usd_mwh:>10.2f} {per_class} {w.requests.height:>8}")
    except (ValueError, FileNotFoundError) as exc:
        print(f"aurelius data window: {exc}", file=sys.stderr)
        return 2
    return 0
