"""`WorldStateModel`, the real component behind the Aurelius policy's `WorldModelPort`.

An in-memory DuckDB `WorldState` ingests each period's delivered observations (arrivals, completions, GPU
telemetry, fleet events, prices), aggregates the period, self-calibrates the planner's serving model from the
period's residuals (decode, prefill, power; CUSUM drift -> risk band), and per decision hands out a read-only
evaluator: a frozen `snapshot(state, as_of)` scored by `ForwardModel(ServingModel with the fitted corrections,
CostConfig())`.

Deliberate approximations (documented, not hidden):

- GPU inventory for idle power and the owned basis comes from the fleet spec (`PolicyContext.fleet`), not
  from the GPUs seen in the last minute of telemetry: the simulator reports telemetry only for GPUs that
  host a replica, so counting seen GPUs would price idle GPUs at zero.
- The first decision (before any observation) is scored against a snapshot in which each plan's floors are
  already warm, which is what the replay's pre-warm does with the first plan (no cold starts charged).
- Telemetry is ingested as delivered (per GPU, 10 s samples). It is small (tens of rows per replica per
  period); `telemetry_stride` subsamples it in time (every n-th sample per GPU, always keeping the last
  minute the snapshot reads) if a deployment's volume makes ingestion the latency bottleneck.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial

import polars as pl

from schemas.cost import CostConfig
from schemas.forecast import DisturbanceForecast, PredictedOutcome
from schemas.plan import BatchAdmission, Plan
from schemas.policy import History, Observations, PolicyContext
from worldmodel.forward import ForwardModel
from worldmodel.horizon import Horizon, HorizonSpec, rollout
from worldmodel.selfcal import SelfCalibrator
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import FleetSnapshot, PoolKey, PoolState, snapshot
from worldmodel.state import WorldState
from worldmodel.state.calibration import calibrate_period

_KIND_OF = {
    "arrivals": "request_arrival",
    "completions": "request_completion",
    "telemetry": "gpu_telemetry",
    "fleet_events": "fleet_event",
    "prices": "price",
}


_PRICES_SQL = """
SELECT interval_start, arg_max(lmp_usd_mwh, coalesce(arrived_at, published_at)) AS lmp_usd_mwh
FROM price WHERE market = $market AND coalesce(arrived_at, published_at) <= $as_of AND lmp_usd_mwh IS NOT NULL
GROUP BY interval_start ORDER BY interval_start
"""


def engine_args(snap: FleetSnapshot, running: Plan) -> dict[PoolKey, tuple[str, int | None]]:
    """Per pool of the running plan, the engine arguments its replicas run (`FleetSnapshot.engine_args`): the KV
    dtype the fleet reports, where it does (an operator may not have applied the plan), else the plan's; the plan's
    token budget.

    >>> from worldmodel.snapshot import PoolState
    >>> from schemas.plan import PoolPlan
    >>> fleet = (PoolState("s", "m", "H100", 2, 0, 0, 4, "fp8", 1980.0, 256, kv_dtype="fp8"),
    ...          PoolState("s", "n", "H100", 1, 0, 0, 1, "fp8", 1980.0, 256, kv_dtype=None))
    >>> plan = Plan(tuple(PoolPlan("s", m, "H100", 1, 4, 4, "fp8", 256, 1980, "auto", 2048) for m in "mn"))
    >>> engine_args(FleetSnapshot(datetime(2023, 7, 1), fleet, ()), plan)
    {('s', 'm', 'H100'): ('fp8', 2048), ('s', 'n', 'H100'): ('auto', 2048)}
    """
    reported = {p.key: p.kv_dtype for p in snap.pools if p.kv_dtype is not None}
    return {p.key: (reported.get(p.key, p.kv_dtype), p.max_num_batched_tokens) for p in running.pools}


class WorldStateModel:
    """`WorldModelPort` over a `WorldState` with per-period self-calibration.

    Two ways to hold the state, one state either way: the embedded replay gives the policy the records of each
    period and this model keeps them in its own DuckDB (`path`); the Kafka worker has already committed them
    to its DuckDB in its own transaction and passes that state (`shared`), which this model then only reads
    (every read keeps to records with ``arrived_at <= as_of``) and adds its derived tables to.

    Parameters
    ----------
    cost_config : operator cost configuration of the forward model (defaults: schemas/cost.py).
    serving : the planner's serving model priors (default `ServingModel()`); corrections are fitted here.
    path : DuckDB file of an own state (":memory:" by default: one state per replay run).
    telemetry_stride : keep every n-th telemetry sample per GPU in an own state (1 = all; the last 60 s are
        always kept).
    shared : the worker's state, already holding every delivered record; None: an own state at `path`.
    """

    def __init__(
        self,
        cost_config: CostConfig | None = None,
        serving: ServingModel | None = None,
        path: str = ":memory:",
        telemetry_stride: int = 1,
        shared: WorldState | None = None,
    ) -> None:
        self.cost_config = cost_config or CostConfig()
        self._prior = serving or ServingModel()
        self.path = path
        self.telemetry_stride = max(int(telemetry_stride), 1)
        self.shared = shared
        self.state: WorldState | None = None
        self.cal = SelfCalibrator()
        self._serving = self._prior
        self._ctx: PolicyContext | None = None
        self._last: datetime | None = None
        self._observed_fleet = False
        self._snap: FleetSnapshot | None = None  # the last snapshot, reused until the state changes
        self.ingest_ms: list[float] = []

    def start(self, ctx: PolicyContext, history: History) -> None:
        if self.state is not None and self.shared is None:
            self.state.close()
        self.state = self.shared or WorldState.open(self.path)
        self.cal = SelfCalibrator()
        self._serving = self._prior
        self._ctx = ctx
        self._last = ctx.window_start
        self._observed_fleet = False
        self._snap = None
        if history.prices.height:
            self.state.update({"price": history.prices})

    def update(self, obs: Observations) -> None:
        assert self.state is not None and self._last is not None, "start() first"
        batch = {}
        for attr, kind in _KIND_OF.items():
            frame = getattr(obs, attr)
            if attr == "telemetry":
                frame = self._thin(frame, obs.as_of)
            if frame is not None and frame.height:
                batch[kind] = frame
        if "fleet_event" in batch:
            self._observed_fleet = True
        if self.shared is None:  # the worker committed them to the shared state already
            self.state.update(batch, ingested_at=obs.as_of)
        self._snap = None
        start, end = self._last, obs.as_of
        self.state.aggregate_period(start, end)
        calibrate_period(self.state, self.cal, self._prior, start, end)
        self._serving = self._prior.with_corrections(self.cal.corrections())
        self._last = end

    def _thin(self, frame: pl.DataFrame, as_of: datetime) -> pl.DataFrame:
        if self.telemetry_stride == 1 or frame.height == 0:
            return frame
        keep_after = as_of - timedelta(seconds=60)
        idx = pl.int_range(pl.len()).over("hostname", "gpu")
        return frame.filter((pl.col("event_at") > keep_after) | (idx % self.telemetry_stride == 0))

    def snapshot(self, as_of: datetime) -> FleetSnapshot:
        """The frozen state as of `as_of`, with the fleet's GPU inventory (see the module docstring)."""
        assert self.state is not None and self._ctx is not None, "start() first"
        if self._snap is None or self._snap.as_of != as_of:  # one state query per decision, however many asks
            self._snap = snapshot(self.state, as_of, inventory=self._ctx.fleet.inventory())
        return self._snap

    def prices(self, market: str, as_of: datetime) -> pl.DataFrame:
        """`market`'s prices published by `as_of` (interval_start, lmp_usd_mwh $/MWh), the latest publication of
        each interval, by interval."""
        assert self.state is not None, "start() first"
        frame = self.state.frame(_PRICES_SQL, {"market": market, "as_of": as_of})
        return frame.with_columns(pl.col("interval_start").dt.convert_time_zone("UTC"))

    def replicas(self, as_of: datetime) -> dict[tuple[str, str, str], int]:
        """Warm + loading replicas per (site, model, gpu) as of `as_of`, from the state."""
        return {p.key: p.warm + p.loading for p in self.snapshot(as_of).pools}

    def waiting(self, as_of: datetime) -> dict[tuple[str, str, str], float]:
        """Sequences waiting per (site, model, gpu) over the minute before `as_of`, from the state's telemetry."""
        return {p.key: p.waiting * p.warm for p in self.snapshot(as_of).pools}

    def evaluator(self, as_of: datetime, forecast: DisturbanceForecast, in_force: Plan | None = None,
                  running: Plan | None = None, spread: bool = True) -> Callable[[Plan], PredictedOutcome]:
        fm, start = self._forward(as_of, in_force, running)
        if not spread:
            return lambda plan: fm.evaluate(start(plan), plan, forecast, scenarios=("point",))
        return lambda plan: fm.evaluate(start(plan), plan, forecast)

    def horizon(self, as_of: datetime, forecasts: tuple[DisturbanceForecast, ...], spec: HorizonSpec,
                in_force: Plan | None = None, running: Plan | None = None,
                continuation: tuple[BatchAdmission, ...] = ()) -> Callable[[Plan], Horizon]:
        """Per plan, its predicted path over the horizon (worldmodel/horizon.py) from the state as of `as_of`,
        deferrable work admitted after the first step by `continuation` (per forecast period)."""
        fm, start = self._forward(as_of, in_force, running)
        point = partial(fm.evaluate, scenarios=("point",))
        return lambda plan: rollout(fm.evaluate, start(plan), plan, forecasts, spec, later=point,
                                    continuation=continuation)

    def _forward(self, as_of: datetime, in_force: Plan | None,
                 running: Plan | None) -> tuple[ForwardModel, Callable[[Plan], FleetSnapshot]]:
        """The forward model and, per plan, the snapshot it starts from: the state as of `as_of` (with the
        in-force plan's floors and the running plan's engine arguments, when given); before the fleet was
        observed, the plan's floors warm (the runtime pre-warms the first plan)."""
        assert self._ctx is not None, "start() first"
        fm = ForwardModel(self._prior, self.cost_config, site_markets={s.name: s.market for s in self._ctx.fleet.sites})
        snap = self.snapshot(as_of)
        if running is not None:
            snap = replace(snap, engine_args=engine_args(snap, running))
        if in_force is not None:
            snap = replace(snap, floors={p.key: p.replica_floor for p in in_force.pools})
        if self._observed_fleet:
            return fm, lambda plan: snap

        def prewarmed(plan: Plan) -> FleetSnapshot:
            pools = tuple(PoolState(p.site, p.model, p.gpu, p.replica_floor, 0, 0, p.tp, p.precision,
                                    float(p.sm_clock_mhz), p.max_batch, kv_dtype=p.kv_dtype)
                          for p in plan.pools)  # fmt: skip
            return replace(snap, pools=pools)

        return fm, prewarmed

    def serving(self) -> ServingModel:
        return self._serving

    def close(self) -> None:
        if self.state is not None and self.shared is None:
            self.state.close()
        self.state = None
