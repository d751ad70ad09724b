"""Workload builder: window rules, volume, determinism, trace order, prefix blocks, deadlines, history."""

from __future__ import annotations

import hashlib
import io
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from schemas.fleet import MARKETS
from schemas.protocol import PROTOCOL_V1
from streams.cli import main
from streams.datasets.prices import load_prices
from streams.datasets.traces import load_azure, load_mooncake
from streams.workload.builder import REGIONS, REQUEST_SCHEMA, build_workload
from streams.workload.rate import RateProfile
from streams.workload.window import run_means, select_window


def _digest(df: pl.DataFrame) -> str:
    buf = io.BytesIO()
    df.write_ipc(buf, compression="uncompressed")
    return hashlib.sha256(buf.getvalue()).hexdigest()


def _brute_force_runs(df: pl.DataFrame, hours: int = 3) -> list[tuple[datetime, float]]:
    rows = df.sort("interval_start").select("interval_start", "lmp_usd_mwh").rows()
    out = []
    for i in range(len(rows) - hours + 1):
        run = rows[i : i + hours]
        if all(run[j + 1][0] - run[j][0] == timedelta(hours=1) for j in range(hours - 1)):
            out.append((run[0][0], sum(p for _, p in run) / hours))
    return out


@pytest.fixture(scope="module")
def default_workloads():
    return {m: build_workload(m, 2023) for m in MARKETS}


# ---- windows ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("market", MARKETS)
def test_max_window_is_brute_force_max(market):
    prices = load_prices(market, [2022, 2023, 2024])
    in_year = load_prices(market, [2023])
    runs = _brute_force_runs(in_year)
    best = max(m for _, m in runs)
    w = select_window(prices, 2023, "max")
    assert w.mean_price_usd_mwh == pytest.approx(best, rel=1e-12)
    assert w.start == min(t for t, m in runs if m == pytest.approx(best, rel=1e-12))
    assert w.end - w.start == timedelta(hours=3) and w.rule == "max"


@pytest.mark.parametrize("market", MARKETS)
def test_median_window_closest_to_median_of_runs(market):
    prices = load_prices(market, [2023])
    means = np.array([m for _, m in _brute_force_runs(prices)])
    w = select_window(prices, 2023, "median")
    distance = np.abs(means - np.median(means))
    assert abs(w.mean_price_usd_mwh - np.median(means)) == pytest.approx(distance.min())


def _synthetic(prices: list[float | None]) -> pl.DataFrame:
    t0 = datetime(2023, 6, 1, tzinfo=UTC)
    rows = [(t0 + timedelta(hours=i), p) for i, p in enumerate(prices) if p is not None]
    return pl.DataFrame(
        {"market": "PJM", "interval_start": [t for t, _ in rows], "lmp_usd_mwh": [p for _, p in rows]},
        schema_overrides={"interval_start": pl.Datetime("us", "UTC")},
    )


def test_windows_never_span_a_gap():
    # without the gap at hour 5, hours 4-6 (1000, -, 1000) would be the most expensive run
    df = _synthetic([10, 10, 10, 10, 1000, None, 1000, 10, 10, 10])
    w = select_window(df, 2023, "max")
    assert w.mean_price_usd_mwh == pytest.approx(340.0)
    assert w.start == datetime(2023, 6, 1, 2, tzinfo=UTC)  # earliest of the tied 10,10,1000 / 1000,10,10
    assert run_means(df, 3).height == 5


def test_median_ties_go_to_earliest():
    df = _synthetic([1, 1, 1, 5, 5, 5, 9, 9, 9])  # run means 1, 7/3, 11/3, 5, 19/3, 23/3, 9 -> median 5
    assert select_window(df, 2023, "median").start == datetime(2023, 6, 1, 3, tzinfo=UTC)
    tie = _synthetic([0, 0, 0, 3, 3, 3])  # means 0, 1, 2, 3: median 1.5, 1 and 2 tie -> earliest
    assert select_window(tie, 2023, "median").mean_price_usd_mwh == pytest.approx(1.0)


def test_explicit_start():
    prices = load_prices("PJM", [2023])
    w = select_window(prices, 2023, "max", start=datetime(2023, 7, 10, 20))  # naive = UTC
    expect = prices.filter(pl.col("interval_start").is_between(datetime(2023, 7, 10, 20, tzinfo=UTC),
                                                                datetime(2023, 7, 10, 22, tzinfo=UTC)))
    assert w.rule == "start" and w.start == datetime(2023, 7, 10, 20, tzinfo=UTC)
    assert w.mean_price_usd_mwh == pytest.approx(expect["lmp_usd_mwh"].mean())
    with pytest.raises(ValueError, match="on the hour"):
        select_window(prices, 2023, start=datetime(2023, 7, 10, 20, 30, tzinfo=UTC))
    with pytest.raises(ValueError, match="not inside"):
        select_window(prices, 2023, start=datetime(2023, 12, 31, 4, tzinfo=UTC))  # runs into the Dec 31 gap


# ---- requests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("market", MARKETS)
def test_volume_shares_and_schema(default_workloads, market):
    w = default_workloads[market]
    r = w.requests
    assert PROTOCOL_V1.target_requests_min <= r.height <= PROTOCOL_V1.target_requests_max
    assert dict(r.schema) == REQUEST_SCHEMA and r.columns == list(REQUEST_SCHEMA)
    assert r["arrival_s"].is_sorted() and 0 <= r["arrival_s"].min() and r["arrival_s"].max() <= 3 * 3600
    shares = dict(r["request_class"].value_counts(normalize=True).iter_rows())
    for spec in PROTOCOL_V1.classes:
        assert shares[spec.name.value] == pytest.approx(spec.share, abs=0.005)
    assert r["request_id"][0] == f"{market}-s0-0000000" and r["request_id"].n_unique() == r.height
    assert r["allowed_regions"][0].to_list() == list(REGIONS)
    models = dict(r.select("request_class", "model").unique().iter_rows())
    assert models == {"code": "llama-3.1-8b", "chat": "llama-3.1-70b", "batch": "llama-3.1-70b"}


def test_arrivals_follow_the_scaled_rate(default_workloads):
    w = default_workloads["CAISO"]
    profile = RateProfile.scaled("CAISO", w.window.start, PROTOCOL_V1.target_requests, 3 * 3600.0)
    counts = np.bincount((w.requests["arrival_s"].to_numpy() // 600).astype(int), minlength=18)[:18]
    expected = np.array([profile.expected(600.0 * i, 600.0 * (i + 1)) for i in range(18)])
    assert expected.sum() == pytest.approx(PROTOCOL_V1.target_requests)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def _cyclic_offset(seq: list, trace: list) -> int:
    """The offset k with seq[j] == trace[(k + j) % len(trace)] for all j; fails if none."""
    n = len(trace)
    for k in (i for i, row in enumerate(trace) if row == seq[0]):
        if all(seq[j] == trace[(k + j) % n] for j in range(len(seq))):
            return k
    raise AssertionError("sizes are not the trace in order from any offset")


def test_chat_and_code_sizes_walk_their_traces_in_order(default_workloads):
    r = default_workloads["PJM"].requests
    for cls, kind in (("chat", "conv"), ("code", "code")):
        got = r.filter(pl.col("request_class") == cls).select("input_tokens", "output_tokens").rows()
        trace = load_azure(kind).select("input_tokens", "output_tokens").rows()
        assert len(got) > len(trace)  # the trace is cycled
        _cyclic_offset(got, trace)


def test_batch_keeps_mooncake_prefix_blocks_and_deadlines(default_workloads):
    r = default_workloads["ERCOT"].requests
    batch = r.filter(pl.col("request_class") == "batch")
    cols = ("input_tokens", "output_tokens", "prefix_block_ids")
    got = [(a, b, tuple(c)) for a, b, c in batch.select(cols).rows()]
    trace = [(a, b, tuple(c)) for a, b, c in load_mooncake().select(cols).rows()]
    _cyclic_offset(got, trace)
    slack = (batch["deadline_s"] - batch["arrival_s"]).to_numpy()
    assert slack.min() >= 1800.0 and slack.max() <= 10800.0
    assert slack.max() - slack.min() > 8000.0  # spread over the range, not constant
    assert batch["sla_ttft_ms"].null_count() == batch["sla_tpot_ms"].null_count() == batch.height
    interactive = r.filter(pl.col("request_class") != "batch")
    assert interactive["deadline_s"].null_count() == interactive.height
    assert interactive["prefix_block_ids"].list.len().max() == 0
    sla = dict(interactive.select("request_class", "sla_ttft_ms").unique().iter_rows())
    assert sla == {"code": 1000.0, "chat": 2000.0}


def test_deterministic_bytes_and_seed_sensitivity():
    a = build_workload("PJM", 2023, periods=6, seed=3)
    b = build_workload("PJM", 2023, periods=6, seed=3)
    c = build_workload("PJM", 2023, periods=6, seed=4)
    assert _digest(a.requests) == _digest(b.requests)
    assert a.history.arrivals_per_minute.equals(b.history.arrivals_per_minute)
    assert a.history.size_quantiles.equals(b.history.size_quantiles)
    assert _digest(a.requests) != _digest(c.requests)
    assert not a.history.arrivals_per_minute.equals(c.history.arrivals_per_minute)
    assert c.requests["request_id"][0] == "PJM-s4-0000000"


def test_shorter_periods_keep_the_rate_scale():
    w = build_workload("ERCOT", 2023, periods=6, period_minutes=5.0)
    profile = RateProfile.scaled("ERCOT", w.window.start, PROTOCOL_V1.target_requests, 3 * 3600.0)
    expected = profile.expected(0.0, 1800.0)
    assert w.requests["arrival_s"].max() < 1800.0
    assert abs(w.requests.height - expected) < 5 * np.sqrt(expected)
    assert expected < PROTOCOL_V1.target_requests / 3


def test_build_is_fast(default_workloads):
    t = time.perf_counter()
    build_workload("PJM", 2023, seed=1)
    assert time.perf_counter() - t < 5.0


def test_provenance_tags_every_generated_field(default_workloads):
    prov = default_workloads["PJM"].provenance
    assert set(prov) == set(REQUEST_SCHEMA) - {"request_id"}
    for col in ("arrival_s", "input_tokens", "output_tokens", "prefix_block_ids"):
        assert prov[col] == "trace-derived"
    assert set(prov.values()) <= {"trace-derived", "modeled"}


# ---- pure-trace mode ----------------------------------------------------------------------------------


def test_azure_replayed_unchanged():
    w = build_workload("CAISO", 2023, source="azure")
    r = w.requests
    code, conv = load_azure("code"), load_azure("conv")
    assert r.height == code.height + conv.height and r["arrival_s"].is_sorted() and r["arrival_s"][0] == 0.0
    for cls, trace in (("code", code), ("chat", conv)):
        mine = r.filter(pl.col("request_class") == cls)
        sizes = ("input_tokens", "output_tokens")
        assert mine.select(sizes).equals(trace.select(sizes))
        t0 = min(code["arrived_at"].min(), conv["arrived_at"].min())
        since = ((trace["arrived_at"] - t0).dt.total_microseconds() / 1e6).to_numpy()
        assert np.allclose(mine["arrival_s"].to_numpy(), since)
    assert w.provenance["request_class"] == "trace-derived"


def test_mooncake_replayed_unchanged_as_chat():
    r = build_workload("PJM", 2023, source="mooncake").requests
    mc = load_mooncake()
    assert r.height == mc.height
    assert set(r["request_class"]) == {"chat"} and set(r["model"]) == {"llama-3.1-70b"}
    assert r["prefix_block_ids"].to_list() == mc["prefix_block_ids"].to_list()
    assert np.allclose(r["arrival_s"].to_numpy(), mc["arrival_ms"].to_numpy() / 1000.0)


# ---- history and prices -------------------------------------------------------------------------------


def test_history_aggregates(default_workloads):
    w = default_workloads["PJM"]
    h = w.history
    start = w.window.start - timedelta(days=7)
    apm = h.arrivals_per_minute
    assert apm.columns == ["minute_at", "request_class", "requests"] and apm.height == 7 * 1440 * 3
    assert apm["minute_at"].min() == start and apm["minute_at"].max() == w.window.start - timedelta(minutes=1)
    profile = RateProfile.scaled("PJM", w.window.start, PROTOCOL_V1.target_requests, 3 * 3600.0)
    expected = profile.expected(-7 * 86400.0, 0.0)
    assert apm["requests"].sum() == pytest.approx(expected, rel=0.01)
    sq = h.size_quantiles
    assert sq.height == 2016 * 3 and sq["period_at"].min() == start
    assert sq.columns == ["period_at", "request_class",
                          "input_tokens_p50", "input_tokens_p90", "input_tokens_p99",
                          "output_tokens_p50", "output_tokens_p90", "output_tokens_p99"]
    assert (sq["input_tokens_p50"] <= sq["input_tokens_p90"]).all()
    assert (sq["input_tokens_p90"] <= sq["input_tokens_p99"]).all()


def test_history_sizes_continue_the_trace_backward(default_workloads):
    w = default_workloads["PJM"]
    chat = w.requests.filter(pl.col("request_class") == "chat").select("input_tokens", "output_tokens").rows()
    conv = load_azure("conv")
    offset = _cyclic_offset(chat[:50], conv.select("input_tokens", "output_tokens").rows())
    last = w.history.arrivals_per_minute.filter(pl.col("request_class") == "chat").tail(5)["requests"].sum()
    rows = np.arange(offset - last, offset) % conv.height
    expect = np.quantile(conv["input_tokens"].to_numpy()[rows], [0.5, 0.9, 0.99])
    got = w.history.size_quantiles.filter(pl.col("request_class") == "chat").tail(1)
    assert np.allclose(got.select("input_tokens_p50", "input_tokens_p90", "input_tokens_p99").row(0), expect)


def test_workload_prices_cover_history_to_horizon(default_workloads):
    w = default_workloads["CAISO"]
    p = w.prices
    assert p["interval_start"].min() == w.window.start - timedelta(days=7)
    assert p["interval_start"].max() >= w.window.end + timedelta(hours=23)
    assert w.history.prices["published_at"].max() <= w.window.start
    assert w.history.prices.height < p.height


def test_history_crossing_new_year():
    w = build_workload("ERCOT", 2021, start=datetime(2021, 1, 2, tzinfo=UTC), periods=1)
    assert w.history.prices["interval_start"].min() == datetime(2020, 12, 26, tzinfo=UTC)


def test_data_window_cli(capsys):
    assert main(["data", "window", "--markets", "PJM,CAISO", "--periods", "2"]) == 0
    out = capsys.readouterr().out
    assert "PJM" in out and "CAISO" in out and "2023-04-21 18:00Z" in out
    assert main(["data", "window", "--markets", "PJM", "--start", "2023-07-10T20:30"]) == 2
