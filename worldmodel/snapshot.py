"""A frozen, in-memory view of the world state as of an instant: what the forward model advances.

Built only from records that arrived by ``as_of`` (no future leakage); reading it never touches the DuckDB
state again, so evaluating any number of candidate plans cannot mutate live state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType

from worldmodel.selfcal import SelfCalibrator
from worldmodel.servingmodel import Corrections
from worldmodel.state import FLOAT_DIGITS, REPLICA_STATE_SQL, WorldState

PoolKey = tuple[str, str, str]


def pool_name(key: PoolKey) -> str:
    """A pool's key as records and messages name it: "site/model/gpu".

    >>> pool_name(("site-pjm", "llama-3.1-8b", "H100"))
    'site-pjm/llama-3.1-8b/H100'
    """
    return "/".join(key)


@dataclass(frozen=True)
class PoolState:
    """Replicas of one (site, model, gpu) pool as of the snapshot.

    warm, loading, cold : replicas by state (count); tp, precision, sm_clock_mhz (MHz), max_batch (count):
    the configuration most recently applied; loading_elapsed_s : seconds each loading replica has loaded;
    running, waiting : mean sequences running / waiting per warm replica over the last minute (count).
    clock_eff_mhz : mean SM clock the warm replicas' GPUs reported over the last minute (MHz; 0 when none):
        below the applied clock when the power cap or heat throttles them.
    warm_age_s : seconds since the pool's newest warm replica last changed state (became ready, or was
        reconfigured; inf when none is warm): when the last scale-up ended.
    kv_dtype : KV-cache dtype most recently applied (vLLM `--kv-cache-dtype`, "auto" = the activation dtype, or
        "fp8"; an event that does not report it keeps the replica's last reported dtype); None when the pool's
        fleet events never reported one.
    """

    site: str
    model: str
    gpu: str
    warm: int
    loading: int
    cold: int
    tp: int
    precision: str
    sm_clock_mhz: float
    max_batch: int
    loading_elapsed_s: tuple[float, ...] = ()
    running: float = 0.0
    waiting: float = 0.0
    clock_eff_mhz: float = 0.0
    warm_age_s: float = math.inf
    kv_dtype: str | None = "auto"

    @property
    def key(self) -> PoolKey:
        return (self.site, self.model, self.gpu)


@dataclass(frozen=True)
class QueueState:
    """Requests of one class that arrived by as_of and had not completed by it (count), with their sizes.

    input_tokens_mean (tokens); oldest_wait_s (s); deadlines_s : for deferrable work, seconds from as_of to
    each outstanding request's deadline (sorted; negative = already missed).
    """

    request_class: str
    model: str
    outstanding: int
    input_tokens_mean: float
    oldest_wait_s: float
    deadlines_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class FleetSnapshot:
    """The state x_t the forward model starts from.

    pools : replicas per pool; queues : outstanding requests per class; prefix_hit_rate : share of input
    tokens served from prefix cache per model over the last 15 min (0-1); power_w : mean GPU board power per
    (site, gpu type) over the last minute (W, summed over GPUs); inventory : the fleet's GPUs per (site, gpu
    type) as the caller knows them (count; empty when unknown), priced on the owned basis and, idle, at idle
    power; placement : per (site, gpu type) the
    GPUs seen hosting replicas over the last minute and the nodes they sit on (count, count: more nodes than
    GPUs / 8 once scale-downs leave nodes part-used, and each draws its non-GPU power); corrections : fitted
    serving-model factors; risk_band : uncertainty multiplier (1-2);
    floors : replica floors of the plan in force per pool (count; empty when unknown).
    engine_args : per pool, the KV-cache dtype and chunked-prefill token budget (tokens, None = the engine's
        default) the replicas run: the dtype the fleet events report (`PoolState.kv_dtype`), else the running
        plan's, and the running plan's budget (fleet events carry none; empty when unknown); the engine takes both
        at start-up, so a plan changing either restarts the pool's replicas.
    """

    as_of: datetime
    pools: tuple[PoolState, ...]
    queues: tuple[QueueState, ...]
    prefix_hit_rate: Mapping[str, float] = field(default_factory=dict)
    power_w: Mapping[tuple[str, str], float] = field(default_factory=dict)
    inventory: Mapping[tuple[str, str], int] = field(default_factory=dict)
    placement: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    corrections: Corrections = field(default_factory=Corrections)
    risk_band: float = 1.0
    floors: Mapping[PoolKey, int] = field(default_factory=dict)
    engine_args: Mapping[PoolKey, tuple[str, int | None]] = field(default_factory=dict)

    def pool(self, key: PoolKey) -> PoolState | None:
        """The pool with this (site, model, gpu) key, or None."""
        for p in self.pools:
            if p.key == key:
                return p
        return None

    def queue(self, request_class: str) -> QueueState | None:
        """The queue of this class, or None."""
        for q in self.queues:
            if q.request_class == request_class:
                return q
        return None


_POOLS_SQL = f"""
WITH r0 AS ({REPLICA_STATE_SQL}),
tel AS (SELECT replica_id, avg(num_requests_running) AS running, avg(num_requests_waiting) AS waiting,
               max(DCGM_FI_DEV_GPU_UTIL) AS util_max, avg(DCGM_FI_DEV_SM_CLOCK) AS clock
        FROM gpu_telemetry WHERE event_at > $as_of::TIMESTAMPTZ - INTERVAL 60 SECOND
          AND event_at <= $as_of AND arrived_at <= $as_of AND replica_id IS NOT NULL GROUP BY 1),
-- a replica whose last event says loading but whose GPUs report work is serving (a pre-warmed replica
-- never announces replica_ready)
r AS (SELECT r0.* REPLACE (CASE WHEN r0.state = 'loading' AND coalesce(t.util_max, 0) > 0 THEN 'warm'
                                ELSE r0.state END AS state)
      FROM r0 LEFT JOIN tel t USING (replica_id))
SELECT site, model, gpu_type, count(*) FILTER (WHERE state = 'warm') AS warm,
       count(*) FILTER (WHERE state = 'loading') AS loading, count(*) FILTER (WHERE state = 'cold') AS cold,
       arg_max(tp, since_at) AS tp, arg_max(precision, since_at) AS precision,
       arg_max(kv_cache_dtype, since_at) AS kv_cache_dtype,
       arg_max(sm_clock_mhz, since_at) AS sm_clock_mhz, arg_max(max_batch, since_at) AS max_batch,
       list(epoch($as_of::TIMESTAMPTZ - since_at)) FILTER (WHERE state = 'loading') AS loading_elapsed_s,
       round(coalesce(avg(tel.running) FILTER (WHERE state = 'warm'), 0), {FLOAT_DIGITS}) AS running,
       round(coalesce(avg(tel.waiting) FILTER (WHERE state = 'warm'), 0), {FLOAT_DIGITS}) AS waiting,
       round(coalesce(avg(tel.clock) FILTER (WHERE state = 'warm'), 0), {FLOAT_DIGITS}) AS clock_eff_mhz,
       min(epoch($as_of::TIMESTAMPTZ - since_at)) FILTER (WHERE state = 'warm') AS warm_age_s
FROM r LEFT JOIN tel USING (replica_id) GROUP BY ALL ORDER BY ALL
"""
_QUEUES_SQL = """
SELECT a.request_class, any_value(a.model) AS model, count(*) AS outstanding,
       avg(a.input_tokens) AS input_tokens_mean,
       max(epoch($as_of::TIMESTAMPTZ - a.event_at)) AS oldest_wait_s,
       list(epoch(a.deadline_at - $as_of::TIMESTAMPTZ) ORDER BY a.deadline_at)
         FILTER (WHERE a.deadline_at IS NOT NULL) AS deadlines_s
FROM request_arrival a
ANTI JOIN (SELECT request_id FROM request_completion WHERE arrived_at <= $as_of) c USING (request_id)
WHERE a.arrived_at <= $as_of AND a.event_at <= $as_of AND a.event_at > $since
GROUP BY 1 ORDER BY 1
"""
_PREFIX_SQL = """
SELECT model, sum(coalesce(cached_input_tokens, 0)) / greatest(sum(input_tokens), 1) AS hit
FROM request_completion WHERE arrived_at <= $as_of AND event_at > $as_of::TIMESTAMPTZ - INTERVAL 15 MINUTE
GROUP BY 1
"""
_POWER_SQL = f"""
WITH g AS (SELECT site, modelName AS gpu, hostname, gpu AS idx, avg(DCGM_FI_DEV_POWER_USAGE) AS w
           FROM gpu_telemetry WHERE arrived_at <= $as_of AND event_at <= $as_of
             AND event_at > $as_of::TIMESTAMPTZ - INTERVAL 60 SECOND GROUP BY ALL)
SELECT site, gpu, round(coalesce(sum(w), 0), {FLOAT_DIGITS}) AS w, count(*) AS n, count(DISTINCT hostname) AS nodes
FROM g GROUP BY ALL
"""
_CAL_SQL = "SELECT * FROM calibration_state ORDER BY ALL"  # one order: the tracks merge in it (float sums)
_BAND_SQL = "SELECT band FROM risk_band WHERE recorded_at <= $as_of ORDER BY recorded_at DESC LIMIT 1"


def snapshot(state: WorldState, as_of: datetime, lookback: timedelta = timedelta(hours=4),
             inventory: Mapping[tuple[str, str], int] | None = None) -> FleetSnapshot:
    """Read the state as of `as_of` into a frozen :class:`FleetSnapshot` (reads only).

    Parameters
    ----------
    state : the world-model state.
    as_of : decision instant (UTC); only records with arrived_at <= as_of are used.
    lookback : how far back outstanding requests are searched (s as a timedelta; covers batch deadlines).
    inventory : the fleet's GPUs per (site, gpu type) (count), from the fleet spec; None: unknown.
    """
    p = {"as_of": as_of}
    pools = tuple(
        PoolState(
            r["site"],
            r["model"],
            r["gpu_type"],
            int(r["warm"]),
            int(r["loading"]),
            int(r["cold"]),
            int(r["tp"] or 1),
            r["precision"] or "bf16",
            float(r["sm_clock_mhz"] or 0.0),
            int(r["max_batch"] or 256),
            tuple(r["loading_elapsed_s"] or ()),
            float(r["running"]),
            float(r["waiting"]),
            float(r["clock_eff_mhz"]),
            float(r["warm_age_s"]) if r["warm_age_s"] is not None else math.inf,
            r["kv_cache_dtype"],
        )
        for r in state.frame(_POOLS_SQL, p).iter_rows(named=True)
    )
    queues = tuple(
        QueueState(
            r["request_class"],
            r["model"],
            int(r["outstanding"]),
            float(r["input_tokens_mean"] or 0.0),
            float(r["oldest_wait_s"] or 0.0),
            tuple(r["deadlines_s"] or ()),
        )
        for r in state.frame(_QUEUES_SQL, {"as_of": as_of, "since": as_of - lookback}).iter_rows(named=True)
    )
    prefix = {r["model"]: float(r["hit"]) for r in state.frame(_PREFIX_SQL, p).iter_rows(named=True)}
    power = state.frame(_POWER_SQL, p)
    cal = SelfCalibrator.from_state_frame(state.frame(_CAL_SQL))
    band = state.frame(_BAND_SQL, p)
    return FleetSnapshot(
        as_of=as_of,
        pools=pools,
        queues=queues,
        prefix_hit_rate=MappingProxyType(prefix),
        power_w=MappingProxyType({(r["site"], r["gpu"]): float(r["w"]) for r in power.iter_rows(named=True)}),
        inventory=MappingProxyType(dict(inventory or {})),
        placement=MappingProxyType(
            {(r["site"], r["gpu"]): (int(r["n"]), int(r["nodes"])) for r in power.iter_rows(named=True)}
        ),
        corrections=cal.corrections(),
        risk_band=float(band["band"][0]) if band.height and not math.isnan(band["band"][0]) else 1.0,
    )
