"""The planner's serving model follows a pool's KV-cache dtype as the engine does: capacity and KV read time.

Until 2026-12-05 it stored the KV cache in the weights' precision, so fp8 weights with vLLM's default ("auto", a
bf16 cache) were predicted to hold twice the sequences they hold and fp8 with an fp8 cache was predicted the same
as fp8 alone (DESIGN.md protocol v2: "Precision includes the KV-cache dtype; capacity and KV read time follow it").
"""

import pytest

from optimizer.replica_capacity import kv_sequences
from schemas.plan import PoolPlan
from worldmodel.physics import kv_capacity_tokens
from worldmodel.servingmodel import PoolConfig, ServingModel

COMBOS = [("bf16", "auto"), ("fp8", "auto"), ("fp8", "fp8")]


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-70b", 4), ("llama-3.1-8b", 1)])
@pytest.mark.parametrize(("precision", "kv"), COMBOS)
def test_kv_capacity_matches_the_engine(model, tp, precision, kv):
    """Tokens per replica at 0.9 of HBM after weights: the planner's prior and the ground truth's physics agree for
    every weights / KV dtype pair the engine runs (the physics floors to whole tokens)."""
    planner = ServingModel().kv_capacity_tokens(PoolConfig("H100", model, tp, precision, 1980.0, kv))
    assert planner == pytest.approx(kv_capacity_tokens(model, "H100", tp, precision, kv_dtype=kv), abs=1.0)


def test_fp8_cache_doubles_sequences_and_reads_faster():
    """fp8 weights: an fp8 cache holds twice the tokens of the default cache and a decode step at a long context
    reads fewer bytes; the default cache reads what bf16 weights' cache reads per token."""
    sm = ServingModel()
    auto, fp8kv, bf16 = (PoolConfig("H100", "llama-3.1-70b", 4, p, 1980.0, kv) for p, kv in
                         (("fp8", "auto"), ("fp8", "fp8"), ("bf16", "auto")))  # fmt: skip
    assert sm.kv_capacity_tokens(fp8kv) == pytest.approx(2 * sm.kv_capacity_tokens(auto), rel=1e-9)
    step = {c.kv_dtype + c.precision: sm.decode_step_s(c, 64, 4000.0) for c in (auto, fp8kv, bf16)}
    assert step["fp8fp8"] < step["autofp8"] < step["autobf16"]
    # the KV bytes of a step: equal per token for bf16 weights and fp8 weights with the default cache
    kv_read = {k: sm.decode_step_s(c, 64, 4000.0) - sm.decode_step_s(c, 64, 0.0)
               for k, c in (("auto", auto), ("bf16", bf16))}  # fmt: skip
    assert kv_read["auto"] == pytest.approx(kv_read["bf16"], rel=1e-9)


def test_a_plans_kv_dtype_reaches_the_capacity_gate():
    """The candidates' and the capacity gate's per-replica sequences read the pool plan's KV dtype."""
    pool = PoolPlan("s", "llama-3.1-70b", "H100", 1, 1, 4, "fp8", 256, 1980)
    auto = kv_sequences(ServingModel(), pool, 3000.0)
    fp8kv = kv_sequences(ServingModel(), PoolPlan(**{**pool.__dict__, "kv_dtype": "fp8"}), 3000.0)
    assert fp8kv == pytest.approx(2 * auto, rel=1e-9)


def test_a_reported_pair_the_fleet_vocabulary_does_not_offer_is_predicted_not_refused():
    """vLLM runs an fp8 cache beside bf16 weights; a fleet that reports one is predicted with an fp8 cache (the
    fleet's vocabulary, `KV_DTYPES_BY_PRECISION`, bounds what plans choose, not what the calibration reads: one
    such fleet event must not stop the worker). An unknown dtype is still an error."""
    sm = ServingModel()
    bf16_fp8 = PoolConfig("H100", "llama-3.1-8b", 1, "bf16", 1980.0, "fp8")
    bf16 = PoolConfig("H100", "llama-3.1-8b", 1, "bf16", 1980.0)
    assert sm.kv_capacity_tokens(bf16_fp8) == pytest.approx(2 * sm.kv_capacity_tokens(bf16), rel=1e-9)
    with pytest.raises(ValueError, match="KV-cache dtype"):
        sm.kv_capacity_tokens(PoolConfig("H100", "llama-3.1-8b", 1, "bf16", 1980.0, "int8"))
