"""The compiled event loop: arrivals, replica iterations, 15 s autoscaler and 10 s telemetry ticks.

`run_until` advances the whole site to a time; the Python runtime calls it once per control period and
applies the next plan in between. Events are ordered by time; stale replica events are skipped by version.

Functions that allocate no arrays are compiled with `_nrt=False` (numba's reference counting off: it took
more time than the simulation itself, NRT_incref/decref 52% of a replay's CPU under perf); the ones that
allocate (`run_until`, `autoscale_tick`, `place_desired`, `telemetry_tick`, `start_replica`, `reload_replica`,
`deferrable_slack`) keep it. Results are identical either way (benchmarks/compare_results.py). `_nrt` is a
private numba option: pyproject pins numba below the next minor release.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from worldmodel.groundtruth.queues import keyed_pop, keyed_push
from worldmodel.groundtruth.replica import (
    cache_lookup,
    credit_busy,
    finish_step,
    has_room,
    join,
    plan_step,
    preempt_if_full,
    truncate_jump,
)
from worldmodel.groundtruth.scaler import autoscale_tick, telemetry_tick
from worldmodel.groundtruth.state import (
    ADM_HOLD,
    ADM_IMMEDIATE,
    DRAINING,
    RT_LEAST_LOAD,
    RT_PREFIX_LOAD,
    S_ADMISSION,
    S_ARR_PTR,
    S_EDF,
    S_HEAP_N,
    S_N_SITES,
    S_NEXT_AS,
    S_NEXT_TEL,
    S_NOW,
    S_RELEASE_MARGIN,
    S_ROUTING,
    S_RR,
    TEL_DT,
    WARM,
    Hardware,
    Logs,
    Pools,
    Queues,
    Replicas,
    Requests,
)

AS_DT = 15.0
MIN_PREFIX_BLOCKS = 1


@njit(cache=True, _nrt=False)
def schedule(
    rep: Replicas,
    r: int,
    req: Requests,
    sf: np.ndarray,
    si: np.ndarray,
    ht: np.ndarray,
    hi: np.ndarray,
    t: float,
) -> None:
    """Plan replica r's next iteration from time t and push its end event."""
    end = plan_step(rep, r, req, sf, t, si[S_EDF] == 1)
    if end < math.inf:
        rep.version[r] += 1
        si[S_HEAP_N] = keyed_push(hi, ht, si[S_HEAP_N], (r << 32) | rep.version[r], end)


@njit(cache=True, _nrt=False)
def batch_releasable(req: Requests, q: Queues, m: int, sf: np.ndarray, si: np.ndarray, t: float) -> bool:
    """Whether the top deferrable request of model m may be dispatched now under the admission mode."""
    if q.bn[m] == 0:
        return False
    adm = si[S_ADMISSION]
    if adm == ADM_IMMEDIATE:
        return True
    i = q.bq[m, 0]
    due = t >= req.deadline[i] - sf[S_RELEASE_MARGIN]
    if adm == ADM_HOLD:
        return due
    # pressure: wait while interactive work of the model is queued
    return due or q.itail[m] == q.ihead[m]


@njit(cache=True, _nrt=False)
def pick_replica(rep: Replicas, pools: Pools, req: Requests, i: int, si: np.ndarray, max_load: float) -> int:
    """Route request i among warm replicas of its model with room (prefix-aware, least-load or round-robin)."""
    m = req.model[i]
    best = -1
    best_score = 1e18
    best_match = 0
    routing = si[S_ROUTING]
    n_rep = rep.n.shape[0]
    start = si[S_RR + m] % n_rep if routing != RT_PREFIX_LOAD and routing != RT_LEAST_LOAD else 0
    for j in range(n_rep):
        r = (start + j) % n_rep
        if rep.state[r] != WARM:
            continue
        p = rep.pool[r]
        if pools.model[p] != m or (req.allowed[i] >> pools.site[p]) & 1 == 0:
            continue
        if not has_room(rep, r, pools.max_batch[p], req, i):
            continue
        load = rep.n[r] / pools.max_batch[p]
        if load > max_load:
            continue
        if routing == RT_PREFIX_LOAD and req.pfx_len[i] > 0:
            match = cache_lookup(rep, r, req, i)
            if match >= MIN_PREFIX_BLOCKS and match > best_match:
                best_match = match
                best = r
                continue
            if best_match > 0:
                continue
        if routing == RT_PREFIX_LOAD or routing == RT_LEAST_LOAD:
            if load < best_score:
                best_score = load
                best = r
        else:
            si[S_RR + m] = r + 1
            return r
    return best


@njit(cache=True, _nrt=False)
def place(
    rep: Replicas,
    req: Requests,
    sf: np.ndarray,
    si: np.ndarray,
    ht: np.ndarray,
    hi: np.ndarray,
    r: int,
    i: int,
    t: float,
) -> None:
    """Join request i to replica r; start the replica if idle, or cut its decode jump short."""
    join(rep, r, req, i, t)
    if rep.stepping[r] == 0:
        schedule(rep, r, req, sf, si, ht, hi, t)
    elif rep.jump_k[r] > 1:
        old_end = rep.step_end[r]
        end = truncate_jump(rep, r, t)
        if end < old_end:
            rep.version[r] += 1
            si[S_HEAP_N] = keyed_push(hi, ht, si[S_HEAP_N], (r << 32) | rep.version[r], end)


@njit(cache=True, _nrt=False)
def drain_queues(
    rep: Replicas,
    pools: Pools,
    req: Requests,
    q: Queues,
    sf: np.ndarray,
    si: np.ndarray,
    ht: np.ndarray,
    hi: np.ndarray,
    m: int,
    t: float,
) -> None:
    """Dispatch queued work of model m to replicas with room: interactive first (EDF), then deferrable.

    With several sites a request whose allowed sites are full does not hold up the ones behind it that may
    run elsewhere (each region's front end queues its own): the first placeable request moves to the head."""
    cap = q.iq.shape[1]
    every = (1 << si[S_N_SITES]) - 1
    while q.ihead[m] != q.itail[m]:
        i = q.iq[m, q.ihead[m] % cap]
        r = pick_replica(rep, pools, req, i, si, 2.0)
        if r < 0:
            if si[S_N_SITES] <= 1:
                return
            full = req.allowed[i] & every  # sites with no room for this model (for a request of this size)
            k = q.ihead[m] + 1
            while k != q.itail[m] and full != every:
                j = q.iq[m, k % cap]
                if req.allowed[j] & every & ~full:
                    r = pick_replica(rep, pools, req, j, si, 2.0)
                    if r >= 0:
                        break
                    full |= req.allowed[j] & every
                k += 1
            if r < 0:
                return
            i = q.iq[m, k % cap]
            for x in range(k, q.ihead[m], -1):  # keep the order of the requests it passes
                q.iq[m, x % cap] = q.iq[m, (x - 1) % cap]
            q.iq[m, q.ihead[m] % cap] = i
        q.ihead[m] += 1
        place(rep, req, sf, si, ht, hi, r, i, t)
    while batch_releasable(req, q, m, sf, si, t):
        i = q.bq[m, 0]
        r = pick_replica(rep, pools, req, i, si, 2.0)
        if r < 0:
            return
        q.bn[m] = keyed_pop(q.bq[m], q.bkey[m], q.bn[m])
        place(rep, req, sf, si, ht, hi, r, i, t)


@njit(cache=True, _nrt=False)
def enqueue(req: Requests, q: Queues, si: np.ndarray, i: int, front: bool) -> None:
    m = req.model[i]
    if req.cls[i] == 2:
        key = req.deadline[i] if si[S_EDF] == 1 else req.arrival[i]
        q.bn[m] = keyed_push(q.bq[m], q.bkey[m], q.bn[m], i, key)
    else:
        cap = q.iq.shape[1]
        if front:
            q.ihead[m] -= 1
            q.iq[m, q.ihead[m] % cap] = i
        else:
            q.iq[m, q.itail[m] % cap] = i
            q.itail[m] += 1


@njit(cache=True, _nrt=False)
def on_step_end(
    rep: Replicas,
    pools: Pools,
    req: Requests,
    q: Queues,
    hw: Hardware,
    logs: Logs,
    sf: np.ndarray,
    si: np.ndarray,
    ht: np.ndarray,
    hi: np.ndarray,
    r: int,
    t: float,
) -> None:
    credit_busy(rep, r, t)
    rep.pfill_acc[r] += rep.step_cmp[r]
    finish_step(rep, r, req, t, logs.completed, logs.n_completed)
    while True:
        i = preempt_if_full(rep, r, req)
        if i < 0:
            break
        enqueue(req, q, si, i, True)
    p = rep.pool[r]
    if rep.state[r] == WARM:
        m = pools.model[p]
        drain_queues(rep, pools, req, q, sf, si, ht, hi, m, t)
    if rep.stepping[r] == 0:
        schedule(rep, r, req, sf, si, ht, hi, t)


@njit(cache=True)
def run_until(
    rep: Replicas,
    pools: Pools,
    req: Requests,
    q: Queues,
    hw: Hardware,
    logs: Logs,
    sf: np.ndarray,
    si: np.ndarray,
    ht: np.ndarray,
    hi: np.ndarray,
    t_end: float,
) -> None:
    """Advance the site from sf[S_NOW] to t_end, processing every event in time order."""
    n_req = req.arrival.shape[0]
    while True:
        t_ev = ht[0] if si[S_HEAP_N] > 0 else math.inf
        ptr = si[S_ARR_PTR]
        t_arr = req.arrival[ptr] if ptr < n_req else math.inf
        t_tick = min(sf[S_NEXT_TEL], sf[S_NEXT_AS])
        t = min(t_ev, min(t_arr, t_tick))
        if t > t_end:
            break
        sf[S_NOW] = t
        if t == t_tick:
            if sf[S_NEXT_TEL] <= sf[S_NEXT_AS]:
                telemetry_tick(rep, pools, req, q, hw, logs, sf, si, t)
                sf[S_NEXT_TEL] = t + TEL_DT
            else:
                autoscale_tick(rep, pools, req, q, hw, logs, sf, si, t)
                sf[S_NEXT_AS] = t + AS_DT
                for m in range(q.bn.shape[0]):
                    drain_queues(rep, pools, req, q, sf, si, ht, hi, m, t)
                # replicas that just became ready start on queued work
                for r in range(rep.n.shape[0]):
                    if rep.state[r] == WARM and rep.stepping[r] == 0 and rep.n[r] > 0:
                        schedule(rep, r, req, sf, si, ht, hi, t)
        elif t == t_arr:
            si[S_ARR_PTR] = ptr + 1
            enqueue(req, q, si, ptr, False)
            drain_queues(rep, pools, req, q, sf, si, ht, hi, req.model[ptr], t)
        else:
            r = hi[0] >> 32  # event item = replica << 32 | version
            v = hi[0] & 0xFFFFFFFF
            si[S_HEAP_N] = keyed_pop(hi, ht, si[S_HEAP_N])
            if v != rep.version[r] or rep.stepping[r] == 0:
                continue
            on_step_end(rep, pools, req, q, hw, logs, sf, si, ht, hi, r, t)
            if rep.state[r] == DRAINING and rep.n[r] == 0:
                rep.stepping[r] = 0
    sf[S_NOW] = t_end


def empty_heap(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Event heap: end times (s) and items (replica << 32 | version)."""
    return np.zeros(capacity), np.zeros(capacity, np.int64)
