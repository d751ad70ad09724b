"""production-tuned's coordinate search: every axis searched at the best of the ones before it, within the
0.1 pp violation rule (the ground-truth runs replaced by a table, so the search logic alone is under test), on one
draw of the week before unless a test says otherwise."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from optimizer.baselines.tuned import DEPLOYED, StaticConfig
from schemas.fleet import default_fleet
from streams.replay import tuning


def _score(cfg: StaticConfig) -> tuple[float, float]:
    """(gp/$, chat violation rate): fp8+fp8 KV helps, batch 512 helps only with it, clock 0.7 breaks the SLA."""
    gp = 100.0
    gp += {("bf16", "auto"): 0.0, ("fp8", "auto"): 5.0, ("fp8", "fp8"): 9.0}[(cfg.precision, cfg.kv_dtype)]
    if cfg.max_batch == 512:
        gp += 4.0 if cfg.kv_dtype == "fp8" else -3.0
    gp += {1.0: 0.0, 0.85: 1.0, 0.7: 6.0}[cfg.clock_share]
    gp += {0.8: 0.0, 0.7: -1.0, 0.9: 2.0}[cfg.target]
    gp += {None: 0.0, 2048: 3.0, 4096: 1.0}[cfg.max_num_batched_tokens]
    viol = 0.01 + (0.02 if cfg.clock_share == 0.7 else 0.0) + (0.0005 if cfg.target == 0.9 else 0.0)
    return gp, viol


def _fake(monkeypatch: pytest.MonkeyPatch, score: Any) -> list[StaticConfig]:
    """Replace the ground-truth runs by `score` (config -> (gp/$, chat violation rate)); the configs run."""
    seen: list[StaticConfig] = []

    def run_replay(wl: Any, policy: Any, *a: Any, **k: Any) -> Any:
        seen.append(policy.config)
        return SimpleNamespace(config=policy.config)

    def summarize(run: Any) -> dict[str, Any]:
        gp, viol = score(run.config)
        energy_mwh = 0.001 * run.config.clock_share  # a lower clock draws less
        return {"gp_per_dollar": gp, "classes": {"chat": {"sla_violation_rate": viol}}, "sla_met": 10 * gp,
                "gpu_cost_usd": 9.0, "cost_usd_owned": 12.0, "energy_cost_usd": 1.0, "energy_mwh": energy_mwh}

    monkeypatch.setattr(tuning, "build_workload", lambda *a, **k: None)
    monkeypatch.setattr(tuning, "lead_in_fleet", lambda *a, **k: {})
    monkeypatch.setattr(tuning, "run_replay", run_replay)
    monkeypatch.setattr(tuning, "summarize", summarize)
    return seen


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[StaticConfig]:
    return _fake(monkeypatch, _score)


def test_coordinate_search_finds_the_best_admissible_configuration(fake_runs: list[StaticConfig]) -> None:
    t = tuning.tune_static("PJM", datetime(2023, 7, 27, 18, tzinfo=UTC), default_fleet(("PJM",)), seed=0, draws=1)
    # fp8 weights + fp8 KV, then batch 512 (better only with the fp8 KV), clock 0.85 (0.7 breaks the SLA),
    # target 0.9 stays within 0.1 pp of the deployed violation rate (+0.05 pp)
    assert t.config == StaticConfig("fp8", "fp8", 512, 0.85, 0.9, 2048)
    assert fake_runs[0] == DEPLOYED
    # each configuration measured once; the restart settings' grid at batch 512, clock 0.85, target 0.9 adds the six
    # pairs the pass had not run (bf16 and fp8 + auto KV at each budget), the clock rows the two other shares at
    # target 0.9 and the 2048 budget
    assert len(fake_runs) == len(set(fake_runs)) == 1 + 2 + 3 + 2 + 2 + 2 + 6 + 2
    assert {r["config"]["kv_dtype"] for r in t.table} == {"auto", "fp8"}
    # the clock's measurements, each share at the configuration chosen (its target and budget included)
    assert t.clock is not None
    assert [(c.share, c.within_sla) for c in t.clock.rows] == [(1.0, True), (0.85, True), (0.7, False)]
    assert [c.sla_met for c in t.clock.rows] == [10 * (100 + 9 + 4 + g + 2 + 3) for g in (0.0, 1.0, 6.0)]
    assert set(fake_runs[-2:]) == {replace(t.config, clock_share=x) for x in (1.0, 0.7)}
    assert {(c.gpu_usd, c.gpu_usd_owned) for c in t.clock.rows} == {(9.0, 11.0)}


def test_a_configuration_outside_the_sla_rule_is_never_chosen(
    fake_runs: list[StaticConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuning, "SLA_SLACK", 0.0001)  # target 0.9's +0.05 pp no longer passes
    t = tuning.tune_static("PJM", datetime(2023, 7, 27, 18, tzinfo=UTC), default_fleet(("PJM",)), seed=0, draws=1)
    assert t.config.target == 0.8 and t.config.clock_share == 0.85


def test_the_restart_settings_are_searched_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8 + fp8 KV breaks the SLA at the engine's default token budget, and the 2048-token budget alone costs
    gp/$ at bf16, so one knob at a time keeps bf16 at the default; the pair holds the SLA and pays: the grid takes
    it, and the clock's measurements are taken again at it."""

    def score(cfg: StaticConfig) -> tuple[float, float]:
        fp8, small = cfg.kv_dtype == "fp8", cfg.max_num_batched_tokens == 2048
        gp = 100.0 + (4.0 if cfg.max_batch == 512 else 0.0) - (2.0 if small else 0.0) + (20.0 if fp8 and small else 0)
        return gp, 0.01 + (0.03 if fp8 and not small else 0.0)

    seen = _fake(monkeypatch, score)
    t = tuning.tune_static("PJM", datetime(2023, 7, 27, 18, tzinfo=UTC), default_fleet(("PJM",)), seed=0, draws=1)
    assert t.config == StaticConfig("fp8", "fp8", 512, 1.0, 0.8, 2048)
    assert t.clock is not None
    shares = {c.share for c in t.clock.rows}
    assert {c for c in seen if c.clock_share in shares and c.max_batch == 512 and c.kv_dtype == "fp8"
            and c.max_num_batched_tokens == 2048} == {replace(t.config, clock_share=x) for x in shares}


def test_draws_pool_each_configuration_over_the_draws_of_the_same_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clock 0.7 measures well on the window's own week before (draw 0) and breaks the SLA on another draw of the
    same hours: one draw takes it, two pooled do not, and every configuration is measured on both draws."""
    seen: list[tuple[StaticConfig, int]] = []

    def run_replay(wl: Any, policy: Any, *a: Any, **k: Any) -> Any:
        seen.append((policy.config, wl))
        return SimpleNamespace(config=policy.config, draw=wl)

    def summarize(run: Any) -> dict[str, Any]:
        slow, other = run.config.clock_share == 0.7, run.draw != 0
        gp = 100.0 + (0.0 if not slow else -10.0 if other else 6.0)
        viol = 0.01 + (0.04 if slow and other else 0.0)
        return {"gp_per_dollar": gp, "classes": {"chat": {"sla_violation_rate": viol}}, "sla_met": 10 * gp,
                "gpu_cost_usd": 9.0, "cost_usd_owned": 12.0, "energy_cost_usd": 1.0, "energy_mwh": 0.001}

    monkeypatch.setattr(tuning, "week_before", lambda market, start, fleet, *, seed, **k: (seed, {}))
    monkeypatch.setattr(tuning, "run_replay", run_replay)
    monkeypatch.setattr(tuning, "summarize", summarize)
    at = (("PJM", datetime(2023, 7, 27, 18, tzinfo=UTC), default_fleet(("PJM",))))
    assert tuning.tune_static(*at, seed=0, draws=1).config.clock_share == 0.7
    seen.clear()
    t = tuning.tune_static(*at, seed=0, draws=2)
    assert t.config.clock_share == 1.0
    draws = {d for _, d in seen}
    assert draws == {0, tuning.DRAW_STRIDE}
    assert all({d for c2, d in seen if c2 == c} == draws for c, _ in seen)
    slow = next(r for r in t.table if r["config"]["clock_share"] == 0.7)
    assert slow["draws"] == 2 and slow["violation"]["chat"] == pytest.approx(0.03)
    # the clock rows keep each draw's measurement beside the pooled one (what `ClockPrices.share_at` checks)
    assert t.clock is not None
    row = next(r for r in t.clock.rows if r.share == 0.7)
    assert [d[0] for d in row.per_draw] == [10 * 106.0, 10 * 90.0] and row.sla_met == 10 * (106 + 90)


def test_the_three_site_mode_is_tuned_on_every_site_with_residency(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three-site window is served at every site with a share of requests pinned to one region: its
    week-before search measures each configuration the same way (every site, residency, the lead-in fleet of
    every site), not at the market's site alone."""
    from dataclasses import dataclass

    import polars as pl

    @dataclass(frozen=True)
    class Past:
        requests: pl.DataFrame

    calls: list[tuple[bool, Any]] = []
    leads: list[bool] = []
    monkeypatch.setattr(tuning, "build_workload", lambda *a, **k: Past(pl.DataFrame(
        {"tenant": ["t"] * 400, "allowed_regions": [["us-east"]] * 400})))  # fmt: skip
    monkeypatch.setattr(tuning, "lead_in_fleet", lambda *a, all_sites=False, **k: leads.append(all_sites) or {})

    def run_replay(wl: Any, policy: Any, *a: Any, all_sites: bool = False, **k: Any) -> Any:
        calls.append((all_sites, wl))
        return SimpleNamespace(config=policy.config)

    monkeypatch.setattr(tuning, "run_replay", run_replay)
    monkeypatch.setattr(tuning, "summarize", lambda run: {
        "gp_per_dollar": _score(run.config)[0], "classes": {"chat": {"sla_violation_rate": 0.01}}, "sla_met": 1000,
        "gpu_cost_usd": 9.0, "cost_usd_owned": 12.0, "energy_cost_usd": 1.0, "energy_mwh": 0.001})  # fmt: skip
    fleet = default_fleet(("ERCOT", "PJM", "CAISO"))
    at = ("ERCOT", datetime(2023, 8, 25, 0, tzinfo=UTC), fleet)
    tuning.tune_static(*at, seed=0, draws=1, all_sites=True)
    assert leads == [True] and calls and all(flag for flag, _ in calls)
    tenants = calls[0][1].requests["tenant"]
    pinned = {t.split("-", 1)[1] for t in tenants if "-" in t}
    assert pinned == {site.region for site in fleet.sites}  # pinned to every site's region
    calls.clear(), leads.clear()
    tuning.tune_static(*at, seed=0, draws=1)
    assert leads == [False] and not any(flag for flag, _ in calls)
    assert calls[0][1].requests["tenant"].to_list() == ["t"] * 400
