"""A fresh worker (issue 18, item 5): started beside a bus without --history-from-replay, the policy gets an
empty History (frames with no columns) and, at first, no price, no telemetry and no arrivals. Every decision
is then the reference plan, flagged fallback with the reason naming what is missing, and decisions keep
coming; once the inputs have arrived the policy forecasts and plans as usual.

The decider is the worker's own (`streams.worker_cli.policy_decider`, as `aurelius worker` builds it), called
through streams/decide.py `PolicyDecider` with typed observation frames (schemas.records.frame_schema), as
the worker's ingestor hands them over after committing them to its world state.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from typing import Any

import polars as pl
import pytest

from optimizer.registry import create
from optimizer.wiring import build_policy
from schemas import validate
from schemas.fleet import default_fleet
from schemas.policy import History, Observations
from schemas.records import frame_schema
from streams.decide import DecisionInput, PolicyDecider
from streams.replay.driver import run_replay
from streams.settings import WorkerSettings
from streams.worker_cli import policy_decider
from streams.workload.builder import build_workload
from worldmodel.state import WorldState

MARKET = "CAISO"
PERIOD_S = 300.0
NO_PRICE = f"no price has arrived for {MARKET}"
NO_TELEMETRY = "no GPU telemetry has arrived"
NO_ARRIVALS = "no request has arrived"
KINDS = {"prices": "price", "arrivals": "request_arrival", "completions": "request_completion",
         "telemetry": "gpu_telemetry", "fleet_events": "fleet_event"}


@pytest.fixture(scope="module")
def stream() -> tuple[datetime, list[Observations], History]:
    """Real observation frames: what the ground-truth simulator delivered to a production run, periods 1-4;
    and the replay's 7-day history."""
    wl = build_workload(MARKET, 2023, periods=3, seed=0)
    seen: list[Observations] = []

    class Recorder:
        name = "production"

        def __init__(self) -> None:
            self.inner = create("production")

        def start(self, ctx, history):
            return self.inner.start(ctx, history)

        def plan(self, obs):
            seen.append(obs)
            return self.inner.plan(obs)

        def last_decision(self):
            return None

    run_replay(wl, Recorder(), default_fleet((MARKET,)), window_s=5 * PERIOD_S, grace_s=0.0)  # type: ignore[arg-type]
    assert [o.period_index for o in seen[:4]] == [1, 2, 3, 4]
    return wl.window.start, seen[:4], wl.history


def fresh_decider(policy: str, origin: datetime, world: WorldState) -> PolicyDecider:
    """What `aurelius worker --policy POLICY` builds without --history-from-replay (its world state passed where
    the worker's decider factory takes one)."""
    settings = WorkerSettings(market=MARKET, policy=policy, period_s=PERIOD_S)
    args: list[Any] = [settings, origin]
    if len(inspect.signature(policy_decider).parameters) > 2:
        args.append(world)
    decider = policy_decider(*args)
    assert isinstance(decider, PolicyDecider)
    assert not decider.history.prices.columns, "the worker's fresh history has no columns"
    return decider


def frames(obs: list[Observations], *attrs: str) -> dict[str, pl.DataFrame]:
    """The records of `attrs` delivered in `obs`, as typed frames per kind (what the worker's ingestor reads);
    the replay's price frames lack event_at (= interval_start) and arrived_at (here: published_at)."""
    out = {}
    for attr in attrs:
        kind = KINDS[attr]
        parts = [getattr(o, attr) for o in obs if getattr(o, attr).height]
        df = pl.concat(parts, how="diagonal_relaxed")
        fill = {"event_at": "interval_start", "arrived_at": "published_at"}
        df = df.with_columns(pl.col(src).alias(c) for c, src in fill.items() if c not in df.columns)
        out[kind] = df.select(list(frame_schema(kind))).cast(frame_schema(kind))  # type: ignore[arg-type]
    return out


def schedule(stream: tuple[datetime, list[Observations], History]) -> list[dict[str, pl.DataFrame]]:
    """Per decision 0-4: nothing (the start), nothing, the prices only, then arrivals and completions, then
    telemetry and fleet events; each delivered no earlier than the replay delivered it."""
    _, obs, _ = stream
    return [{}, {}, frames(obs[:2], "prices"), frames(obs[:3], "arrivals", "completions"),
            frames(obs[:4], "telemetry", "fleet_events")]


def decide_all(decider: PolicyDecider, origin: datetime, world: WorldState,
               batches: list[dict[str, pl.DataFrame]]) -> list[dict[str, Any]]:
    records = []
    for k, batch in enumerate(batches):
        as_of = origin + timedelta(seconds=k * PERIOD_S)
        if batch:
            world.update(batch, ingested_at=as_of)  # the worker commits a batch before deciding on it
        records.append(decider.decide(DecisionInput(k, as_of, batch, 0)))
    return records


def reference_plans(decider: PolicyDecider, origin: datetime, batches: list[dict[str, pl.DataFrame]]) -> list[dict]:
    """The reference policy's own plans for the same context, history and observations."""
    ref = create("production")
    plans = [ref.start(decider.ctx, decider.history).as_dict()]
    for k, batch in enumerate(batches[1:], start=1):
        f = {kind: batch.get(kind, pl.DataFrame(schema=frame_schema(kind))) for kind in KINDS.values()}
        obs = Observations(origin + timedelta(seconds=k * PERIOD_S), k, f["request_arrival"],
                           f["request_completion"], f["gpu_telemetry"], f["fleet_event"], f["price"])
        plans.append(ref.plan(obs).as_dict())
    return plans


@pytest.mark.slow
def test_fresh_aurelius_falls_back_until_its_inputs_arrive(stream):
    origin, _, _ = stream
    world = WorldState.open(":memory:")
    decider = fresh_decider("aurelius", origin, world)
    batches = schedule(stream)
    records = decide_all(decider, origin, world, batches)  # no exception: the worker keeps running
    refs = reference_plans(decider, origin, batches)

    missing = [[w for w in (NO_PRICE, NO_TELEMETRY, NO_ARRIVALS) if w in (r["fallback_reason"] or "")]
               for r in records]
    assert missing == [[NO_PRICE, NO_TELEMETRY, NO_ARRIVALS], [NO_PRICE, NO_TELEMETRY, NO_ARRIVALS],
                       [NO_TELEMETRY, NO_ARRIVALS], [NO_TELEMETRY], []]
    for k, r in enumerate(records[:4]):
        assert r["fallback"] is True, k
        assert r["fallback_reason"].startswith("missing inputs: "), r["fallback_reason"]
        assert r["chosen_plan"] == refs[k] == r["reference_plan"], k
        assert r["forecasts"] == {} and r["candidates_evaluated"] == 0
        validate("audit_record", r)
    # every input seen: the policy forecasts and decides as usual (a fallback now is the confidence one)
    last = records[4]
    assert "missing inputs" not in (last["fallback_reason"] or "")
    assert "missing_inputs" not in last
    assert last["forecasts"]["price_usd_mwh"]["point"] > 0
    validate("audit_record", last)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["production", "naive", "production-tuned"])
def test_fresh_reference_policies_keep_deciding(stream, policy):
    origin, _, _ = stream
    world = WorldState.open(":memory:")
    records = decide_all(fresh_decider(policy, origin, world), origin, world, schedule(stream))
    assert [r["period_index"] for r in records] == [0, 1, 2, 3, 4]
    assert all(r["chosen_plan"]["pools"] for r in records)


@pytest.mark.slow
def test_a_history_without_prices_falls_back_on_the_forecasters_word(stream):
    """With a history the fresh-start checks are off (the replay's decisions stay as they were); a price that has
    still not arrived is then the forecaster's call (forecasting.bundle.MissingInputError), with the same fallback."""
    origin, _, history = stream
    fresh = fresh_decider("aurelius", origin, WorldState.open(":memory:"))
    no_prices = History(history.arrivals_per_minute, history.size_quantiles, pl.DataFrame())
    decider = PolicyDecider(build_policy("aurelius", audit=False), fresh.ctx, no_prices)
    for k in (0, 1):
        as_of = origin + timedelta(seconds=k * PERIOD_S)
        r = decider.decide(DecisionInput(k, as_of, {}, 0))
        assert r["fallback"] is True
        assert r["fallback_reason"] == f"missing inputs: {NO_PRICE} by {as_of.isoformat()}"
        assert r["chosen_plan"] == r["reference_plan"]
