"""Operator calibration on the worked example: a short history generated under hidden coefficient factors;
the fit recovers each within 5% and tags it fitted; what the records cannot identify stays at its cited
default, tagged so."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from streams.calibration import DEFAULT, FITTED, UNFITTED, calibrate
from streams.worked_example import ExampleSpec, generate_history
from worldmodel.groundtruth.runtime import CoefficientCorrections, Physics

pytestmark = pytest.mark.slow
FACTORS = ("prefill_scale", "decode_scale", "idle_power_scale", "active_power_scale")


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[dict[str, pl.DataFrame], dict]:
    out = tmp_path_factory.mktemp("history")
    history = generate_history(out, ExampleSpec(periods=3))  # 15 min of arrivals, ~10k requests
    truth = json.loads((out / "truth.json").read_text())
    assert not (history / "truth.json").exists()  # the hidden factors are not part of the history
    kinds = ("completions", "telemetry", "fleet_events")
    return {k: pl.read_parquet(Path(history) / f"{k}.parquet") for k in kinds}, truth


def test_the_calibration_recovers_every_hidden_factor_within_5_percent(example):
    records, truth = example
    cal = calibrate(records["completions"], records["telemetry"], records["fleet_events"])
    assert {(p.model, p.gpu) for p in cal.pools} == {("llama-3.1-8b", "H100"), ("llama-3.1-70b", "H100")}
    for pool in cal.pools:
        for name in FACTORS:
            f = pool.factor(name)
            assert f.tag == FITTED, (pool.model, f)
            assert f.value == pytest.approx(truth["factors"][name], rel=0.05), (pool.model, f)
            assert f.n >= 100 and f.residual_rms >= 0.0
        # per-node fits (the factors times each node's hidden speed) bracket the pool's
        decode = [n.decode_scale for n in pool.nodes]
        assert pool.nodes and min(decode) <= pool.factor("decode_scale").value * 1.001
        assert max(decode) >= pool.factor("decode_scale").value * 0.999
    # the fitted physics carries one correction per pool, named by model and GPU type
    physics = cal.physics()
    assert {(c.model, c.gpu) for c in physics.corrections} == {(p.model, p.gpu) for p in cal.pools}
    assert physics.corrections[0] == cal.pools[0].corrections()
    assert isinstance(physics.corrections[0], CoefficientCorrections)
    json.dumps(cal.as_dict())


def test_the_calibration_starts_from_the_cited_coefficients(example):
    """Corrections already in the physics handed in are not compounded (the fit is against the cited rows), and
    the figures do not depend on the order the records come in."""
    records, _ = example
    base = Physics(corrections=(CoefficientCorrections(decode_scale=2.0),))
    a = calibrate(records["completions"], records["telemetry"], records["fleet_events"])
    shuffled = {k: v.sample(fraction=1.0, shuffle=True, seed=1) for k, v in records.items()}
    b = calibrate(shuffled["completions"], shuffled["telemetry"], shuffled["fleet_events"], physics=base)
    assert a.as_dict() == b.as_dict()


def test_the_calibration_reads_the_kv_cache_dtype_of_the_fleet_events(example):
    """The example ran every pool with an "auto" KV cache: fleet events without the field (recorded before it)
    give the same fit; the fp8 pool's events claiming an fp8 KV cache (half the KV read time) change its decode
    factor, and only its."""
    records, _ = example
    ev = records["fleet_events"]
    assert ev["kv_cache_dtype"].unique().to_list() == ["auto"]
    a = calibrate(records["completions"], records["telemetry"], ev)
    assert calibrate(records["completions"], records["telemetry"], ev.drop("kv_cache_dtype")).as_dict() == a.as_dict()
    fp8 = ev.with_columns(pl.when(pl.col("precision") == "fp8").then(pl.lit("fp8")).otherwise("kv_cache_dtype")
                          .alias("kv_cache_dtype"))  # fmt: skip
    b = calibrate(records["completions"], records["telemetry"], fp8)
    changed = {p.model for p in b.pools if p.factor("decode_scale") != a.pool(p.model, p.gpu).factor("decode_scale")}
    assert changed == set(ev.filter(pl.col("precision") == "fp8")["model"].unique()) != set()
    # a fleet reporting the dtype at start only: later events (ready) keep the one the start reported
    started = pl.col("kind") == "replica_started"
    silent = fp8.with_columns(pl.when(started).then("kv_cache_dtype").otherwise(None).alias("kv_cache_dtype"))
    assert silent.filter(pl.col("precision") == "fp8")["kv_cache_dtype"].null_count() > 0
    assert calibrate(records["completions"], records["telemetry"], silent).as_dict() == b.as_dict()
    # vLLM runs an fp8 cache beside bf16 weights too; a fleet reporting one is fitted, not a ValueError
    bf16 = ev.filter(pl.col("precision") == "bf16")
    assert bf16.height
    c = calibrate(records["completions"], records["telemetry"],
                  ev.with_columns(pl.lit("fp8").alias("kv_cache_dtype")))  # fmt: skip
    moved = {(p.model, p.gpu) for p in c.pools
             if p.factor("decode_scale") != a.pool(p.model, p.gpu).factor("decode_scale")}  # fmt: skip
    assert moved >= set(bf16.select("model", "gpu_type").unique().iter_rows())


def test_what_the_records_cannot_identify_stays_at_its_cited_default(example):
    """Clocks locked at or below the power-limited clock leave no prefill dip in telemetry, so the power factors
    cannot be fitted; a history without completions of a model leaves its step factors unfitted too."""
    records, _ = example
    locked = records["fleet_events"].with_columns(pl.lit(1500.0).alias("sm_clock_mhz"))
    eight_b = records["completions"].filter(pl.col("model") == "llama-3.1-8b")
    cal = calibrate(eight_b, records["telemetry"], locked)
    for pool in cal.pools:
        for name in ("idle_power_scale", "active_power_scale"):
            f = pool.factor(name)
            assert (f.tag, f.value) == (DEFAULT, 1.0)
            assert "fewer than" in f.source
    seventy = cal.pool("llama-3.1-70b", "H100")
    for name in ("prefill_scale", "decode_scale"):
        assert (seventy.factor(name).tag, seventy.factor(name).value, seventy.factor(name).n) == (DEFAULT, 1.0, 0)
    assert cal.pool("llama-3.1-8b", "H100").factor("decode_scale").tag == FITTED
    assert dict(cal.unfitted) == dict(UNFITTED) and "weights_load_s" in cal.as_dict()["cited_defaults"]
