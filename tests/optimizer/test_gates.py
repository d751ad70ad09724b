"""Each gate rejects what it should, with its reason; the Pareto and confidence fallbacks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from opt_fakes import FLEET, fake_outcome, forecast, reference_plan

from optimizer.fallback import Scored, confidence_fallback, decide
from optimizer.gates import (
    GateConfig,
    GateContext,
    Tenant,
    capacity_gate,
    hard_gates,
    pareto_gate,
    policy_gate,
    power_gate,
    replicas_changed,
    residency_gate,
    sla_gate,
)
from optimizer.levers import PrecisionPolicy, set_pool
from optimizer.margins import families_moved, load_margins
from optimizer.objective import Objective
from schemas.forecast import ClassOutcome

F = forecast()
REF = reference_plan()
CTX = GateContext(FLEET, F, REF)
CFG = GateConfig()
A100_8B = ("site-pjm", "llama-3.1-8b", "A100")
H100_70B = ("site-pjm", "llama-3.1-70b", "H100")


def with_violation(outcome, cls, rate):
    classes = tuple(replace(c, violation_rate=rate) if c.request_class == cls else c for c in outcome.classes)
    return replace(outcome, classes=classes)


def test_reference_passes_every_hard_gate():
    gates = hard_gates(REF, fake_outcome(REF, F), CTX, CFG)
    assert [g.name for g in gates] == ["sla", "capacity", "power", "residency", "policy"]
    assert all(g.passed for g in gates), gates


def test_sla_gate_rejects_violation_above_class_budget():
    o = with_violation(fake_outcome(REF, F), "chat", 0.02)
    g = sla_gate(o, CFG)
    assert not g.passed and "chat 2.00% > budget 1.00%" in g.reason
    assert sla_gate(o, GateConfig(sla_budget={"chat": 0.05})).passed


def test_capacity_gate_rejects_gpus_beyond_inventory():
    plan = set_pool(REF, H100_70B, replica_floor=9, replica_ceiling=9)  # 36 GPUs of 32
    g = capacity_gate(plan, CTX, CFG)
    assert not g.passed and "ceiling 9 x tp 4 > 32 H100 GPUs" in g.reason and "floors need 36" in g.reason


def test_capacity_gate_rejects_weights_that_do_not_fit():
    plan = set_pool(REF, H100_70B, tp=1, replica_floor=1, replica_ceiling=1)  # 70B bf16 on one 80 GB GPU
    g = capacity_gate(plan, CTX, CFG)
    assert not g.passed and "bf16 weights do not fit 1 x H100" in g.reason


def test_capacity_gate_rejects_max_batch_whose_kv_does_not_fit():
    # 8B bf16 on one A100: ~56 GB of KV at 128 KiB/token holds ~215 sequences of 2,015 tokens; 2x = ~430
    g = capacity_gate(set_pool(REF, A100_8B, max_batch=512), CTX, CFG)
    assert not g.passed and "max_batch 512 > 2 x" in g.reason
    assert capacity_gate(set_pool(REF, A100_8B, max_batch=384), CTX, CFG).passed


def test_capacity_gate_passes_the_engine_default_batch_cap():
    """vLLM V1's H100 default (1,024 sequences) is how the references deploy 70B, whose KV holds far fewer:
    the engine admits by KV, so the default passes while anything above it still needs the KV to fit."""
    assert capacity_gate(set_pool(REF, H100_70B, max_batch=1024), CTX, CFG).passed
    g = capacity_gate(set_pool(REF, H100_70B, max_batch=1025), CTX, CFG)
    assert not g.passed and "max_batch 1025 > 2 x" in g.reason


def test_power_gate_rejects_peak_above_site_cap():
    o = replace(fake_outcome(REF, F), peak_power_w=61_000.0)
    g = power_gate(REF, o, CTX)
    assert not g.passed and g.reason == "peak 61.0 kW > cap 60.0 kW"


def test_residency_gate_rejects_model_served_outside_allowed_regions():
    ctx = replace(CTX, tenants={"acme": Tenant(("llama-3.1-70b",), ("eu-west",))})
    g = residency_gate(REF, ctx)
    assert not g.passed
    assert "tenant acme: llama-3.1-70b served in ['us-east'], allowed ['eu-west']" in g.reason
    ok = replace(CTX, tenants={"acme": Tenant(("llama-3.1-70b",), ("us-east", "eu-west"))})
    assert residency_gate(REF, ok).passed


def test_policy_gate_rejects_disallowed_precision():
    fp8_a100 = set_pool(REF, A100_8B, precision="fp8")  # Ampere has no FP8
    g = policy_gate(fp8_a100, CTX, CFG)
    assert not g.passed and "site-pjm/llama-3.1-8b/A100: fp8 not allowed" in g.reason
    fp8_h100 = set_pool(REF, H100_70B, precision="fp8")
    assert policy_gate(fp8_h100, replace(CTX, previous=fp8_h100), CFG).passed
    by_model = GateConfig(precision_policy=PrecisionPolicy(by_model={"llama-3.1-70b": ("bf16",)}))
    assert not policy_gate(fp8_h100, replace(CTX, previous=fp8_h100), by_model).passed
    by_tenant = GateConfig(precision_policy=PrecisionPolicy(by_tenant={"bank": ("bf16",)}))
    ctx = replace(CTX, previous=fp8_h100, tenants={"bank": Tenant(("llama-3.1-70b",), ())})
    g = policy_gate(fp8_h100, ctx, by_tenant)
    assert not g.passed and "fp8 not allowed" in g.reason


def test_policy_gate_rejects_a_kv_dtype_not_offered_with_the_weights():
    """The fleet offers an fp8 KV cache with fp8 weights only (`KV_DTYPES_BY_PRECISION`): the physics simulates
    bf16 weights beside an fp8 cache (a recorded fleet may run it), so the gate is what keeps plans from it."""
    fp8_kv = set_pool(REF, H100_70B, precision="fp8", kv_dtype="fp8")
    assert policy_gate(fp8_kv, replace(CTX, previous=fp8_kv), CFG).passed
    bf16_fp8 = set_pool(REF, H100_70B, precision="bf16", kv_dtype="fp8")
    g = policy_gate(bf16_fp8, replace(CTX, previous=bf16_fp8), CFG)
    assert not g.passed and "site-pjm/llama-3.1-70b/H100: kv_dtype fp8 not offered with bf16 weights" in g.reason


def test_a_release_under_load_is_no_hard_failure_but_must_clear_the_capacity_margin():
    """Capacity is two-sided: a ceiling below the replicas a pool runs passes the hard gates; the Pareto gate
    asks it for the capacity family's measured margin (optimizer/lever_margins.json)."""
    cut = set_pool(REF, H100_70B, replica_floor=0, replica_ceiling=2)
    assert policy_gate(cut, CTX, CFG).passed
    margins = load_margins("horizon")
    assert families_moved(cut, REF) == {"capacity"}
    assert margins.of(cut, REF) == margins.by_family["capacity"] > 0.0
    assert margins.of(REF, REF) == 0.0


def test_policy_gate_rejects_swap_over_budget():
    # precision change reloads the 5 warm replicas; floor 5 -> 8 starts 3 more: 8 replicas changed
    plan = set_pool(REF, H100_70B, precision="fp8", replica_floor=8)
    assert replicas_changed(REF, plan) == 8
    g = policy_gate(plan, CTX, GateConfig(swap_budget=7))
    assert not g.passed and "8 replicas changed > swap budget 7" in g.reason
    assert policy_gate(plan, CTX, GateConfig(swap_budget=8)).passed


def test_pareto_gate():
    obj = Objective(0.5)
    ref = fake_outcome(REF, F)
    better = replace(ref, gp_per_dollar=ref.gp_per_dollar * 1.1, gp_per_dollar_lo=ref.gp_per_dollar_lo * 1.1)
    assert pareto_gate(better, ref, obj).passed
    tie = replace(ref, gp_per_dollar=ref.gp_per_dollar * (1 + 2e-16))  # the same score summed in another order
    assert not pareto_gate(tie, ref, obj).passed
    assert pareto_gate(replace(better, gp_per_dollar=ref.gp_per_dollar * (1 + 1e-6)), ref, obj).passed
    worse = replace(ref, gp_per_dollar=ref.gp_per_dollar * 0.9, gp_per_dollar_lo=ref.gp_per_dollar_lo * 0.9)
    g = pareto_gate(worse, ref, obj)
    assert not g.passed and "<= reference" in g.reason
    ref_chat = next(c.violation_rate for c in ref.classes if c.request_class == "chat")
    regress = with_violation(better, "chat", ref_chat + 0.0015)  # +0.15 pp
    g = pareto_gate(regress, ref, obj)
    assert not g.passed and "chat violation +0.15 pp > 0.1 pp over reference" in g.reason
    assert pareto_gate(with_violation(better, "chat", ref_chat + 0.0005), ref, obj).passed  # +0.05 pp
    # within tolerance at the point forecast, +0.5 pp at the 95% demand bound: rejected
    ref_hi = next(c.violation_rate_hi for c in ref.classes if c.request_class == "chat")
    classes = tuple(replace(c, violation_rate_hi=ref_hi + 0.005) if c.request_class == "chat" else c
                    for c in with_violation(better, "chat", ref_chat + 0.0005).classes)
    g = pareto_gate(replace(better, classes=classes), ref, obj)
    assert not g.passed and "chat violation at the 95% demand bound +0.50 pp" in g.reason


def _scored(plan, outcome, gates=None):
    gates = gates if gates is not None else hard_gates(plan, outcome, CTX, CFG)
    return Scored(plan, outcome, Objective().score(outcome), gates)


def test_pareto_fallback_recommends_reference_with_reason():
    ref = _scored(REF, fake_outcome(REF, F))
    o = ref.outcome
    cand_out = replace(o, gp_per_dollar=o.gp_per_dollar * 2, gp_per_dollar_lo=o.gp_per_dollar_lo * 2,
                       classes=tuple(replace(c, violation_rate=c.violation_rate + 0.005) for c in o.classes))
    cand = _scored(replace(REF, label="cheaper but worse SLA"), cand_out)
    assert cand.feasible  # within the 1% budgets, but +0.5 pp over the reference
    d = decide([cand, ref], ref, Objective())
    assert d.fallback and d.plan is REF
    assert d.reason.startswith("pareto:") and "violation +0.50 pp" in d.reason
    assert any(g.name == "pareto" and not g.passed for g in d.gates)
    # the candidate refused and its predicted gain as the gate measured it (twice the reference's gp/$)
    assert d.refused is not None and d.refused[0].label == "cheaper but worse SLA"
    assert d.refused[1] == pytest.approx(1.0)
    assert decide([ref], ref, Objective()).refused[0] is REF  # the gate refuses the reference itself too


def test_decide_takes_the_best_candidate_that_passes_pareto():
    ref = _scored(REF, fake_outcome(REF, F))
    o = ref.outcome
    bad = _scored(replace(REF, label="bad"), replace(
        o, gp_per_dollar=o.gp_per_dollar * 3, gp_per_dollar_lo=o.gp_per_dollar_lo * 3,
        classes=tuple(replace(c, violation_rate=c.violation_rate + 0.005) for c in o.classes)))
    good = _scored(replace(REF, label="good"), replace(o, gp_per_dollar=o.gp_per_dollar * 2,
                                                         gp_per_dollar_lo=o.gp_per_dollar_lo * 2))
    d = decide([bad, good, ref], ref, Objective())
    assert not d.fallback and d.plan.label == "good" and d.gates[-1].name == "pareto" and d.refused is None


def test_no_feasible_candidate_falls_back():
    ref = _scored(REF, fake_outcome(REF, F))
    o = with_violation(ref.outcome, "code", 0.5)
    cand = _scored(replace(REF, label="x"), o)
    d = decide([cand], ref, Objective())
    assert d.fallback and d.plan is REF and "no candidate passed the hard gates" in d.reason and d.refused is None
    assert "sla: code 50.00% > budget 1.00%" in d.reason


def test_candidate_over_budget_competes_when_the_reference_is_worse():
    ref_out = with_violation(fake_outcome(REF, F), "code", 0.5)  # the reference breaks the 1% budget itself
    ref = _scored(REF, ref_out)
    o = with_violation(ref_out, "code", 0.05)  # over budget, but 45 pp better than the reference
    o = replace(o, gp_per_dollar=o.gp_per_dollar * 2, gp_per_dollar_lo=o.gp_per_dollar_lo * 2)
    cand = _scored(replace(REF, label="better than the reference"), o)
    assert not cand.feasible
    d = decide([cand], ref, Objective())
    assert not d.fallback and d.plan.label == "better than the reference"
    worse = _scored(replace(REF, label="worse"), with_violation(ref_out, "code", 0.6))
    assert decide([worse], ref, Objective()).fallback


def test_confidence_fallback_reason():
    assert confidence_fallback(0.3, 0.5) == "forecast confidence 0.30 < threshold 0.50"
    assert confidence_fallback(0.5, 0.5) is None


def test_class_outcome_fields_used_by_gates_exist():
    assert {"request_class", "violation_rate"} <= set(ClassOutcome.__dataclass_fields__)
