"""Candidate generation rules that keep the plan's floors from pinning replicas."""

from __future__ import annotations

from dataclasses import replace

from opt_fakes import FLEET, SERVING, TPOT_SLO_S, forecast, reference_plan

from optimizer.candidates import GenerationInputs, generate
from optimizer.levers import lever_space

REF = reference_plan()


def inputs(previous=REF, current=None) -> GenerationInputs:  # noqa: ANN001
    return GenerationInputs(
        fleet=FLEET, space=lever_space(FLEET, REF.pools, clock_levels=1), reference=REF, previous=previous,
        forecasts=(forecast(),) * 3, price_history_usd_mwh=(50.0, 100.0, 150.0), tpot_slo_s=TPOT_SLO_S,
        admission=None, swap_budget=16, serving=SERVING, current_replicas=current or {},
    )


def floors(plan) -> dict:  # noqa: ANN001
    return {p.key: p.replica_floor for p in plan.pools}


def test_previous_keeps_its_levers_but_takes_the_reference_floors():
    pinned = REF.with_pools(tuple(replace(p, replica_floor=p.replica_ceiling, max_batch=128) for p in REF.pools))
    prev = next(p for p in generate(inputs(previous=pinned)) if p.label == "previous")
    assert floors(prev) == floors(REF)
    assert all(p.max_batch == 128 for p in prev.pools)


def test_milp_counts_become_floors_only_as_a_prewarm():
    unknown = [p for p in generate(inputs()) if p.label.startswith("milp")]
    assert any(floors(p) != floors(REF) for p in unknown)  # the fixture's demand sizes other counts
    many = {p.key: p.replica_ceiling for p in REF.pools}  # far more running than the MILP sizes: no pre-warm
    for plan in (p for p in generate(inputs(current=many)) if p.label.startswith("milp")):
        assert all(floors(plan)[k] <= f for k, f in floors(REF).items())
    none = {p.key: 0 for p in REF.pools}  # nothing running: every model the MILP sizes is a pre-warm
    prewarm = [p for p in generate(inputs(current=none)) if p.label.startswith("milp")]
    assert prewarm and all(floors(a) == floors(b) for a, b in zip(prewarm, unknown, strict=False))


def test_every_candidate_runs_weights_with_a_kv_dtype_the_engine_accepts():
    """A reference at fp8 weights with an fp8 KV cache (production-tuned's searched configuration): the candidates
    and the precision neighbours that switch the weights to bf16 take the KV dtype back to "auto", which the
    ground truth accepts (bf16 with an fp8 KV cache stopped a replay)."""
    from optimizer.baselines.tuned import with_precision
    from optimizer.levers import neighbours
    from schemas.fleet import KV_DTYPES_BY_PRECISION, Precision

    fp8 = with_precision(REF, "fp8", "fp8")
    inp = replace(inputs(previous=fp8), reference=fp8, space=lever_space(FLEET, fp8.pools, clock_levels=1))
    plans = generate(inp) + [p for _, p in neighbours(fp8, inp.space, ("precision",))]
    switched = [q for p in plans for q in p.pools if q.precision == "bf16" and q.gpu == "H100"]
    assert switched  # some plan moves an H100 pool back to bf16 weights
    assert all(q.kv_dtype in KV_DTYPES_BY_PRECISION[Precision(q.precision)] for p in plans for q in p.pools)
