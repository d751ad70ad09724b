"""Compiled fleet control inside a period: the HPA-like autoscaler (15 s), replica lifecycle, GPU placement,
and the 10 s telemetry tick with activity-dependent power and the site power-cap controller.

Autoscaler triggers per model and site (Physics.scaler_trigger; si[S_SCALER_TRIGGER]):

- utilization (both): desired = ceil(replicas x max(running / batch slots + prefill share, KV use) / target),
  left alone within +-10% of the target.
- ``v1`` (default), vLLM V1's gauges: a request is *waiting* until the engine schedules it (front-end queues,
  and sequences admitted to a replica that have not been given any prefill chunk since they joined: prefill
  not started); a partially prefilled or decoding sequence is *running*. The KEDA-style backlog trigger
  ceil(waiting / 5) counts interactive work only (code, chat); deferrable (batch-class) work keeps its low
  priority and scales the fleet through its deadline slack instead, as batch endpoints do:
  deferrable work of the model (queued, under HOLD only what is due for release, plus admitted and
  unfinished) is binned by deadline; its remaining tokens are prompt left to prefill (a queued request's
  whole prompt) plus an output estimate, max(mean - generated, 1), where the mean is a running mean of the
  model's completed deferrable outputs with a prior of DEFERRABLE_OUT_PRIOR tokens weighing
  DEFERRABLE_OUT_PRIOR_N completions (the output length of unfinished work is never read). A replica's
  token rate for that mix comes from its step coefficients (chunked prefill at the mix's mean prompt, decode
  at the batch its slots and KV allow). For each deadline D (EDF prefix: all work due by D), the capacity of
  the warm and loading replicas until D (loading ones from their ready time), less the interactive sequences'
  share of their slots, at the autoscaler's target utilization, is compared with the work; a shortfall adds
  ceil(shortfall / (new replica rate x target x (D - now - cold start))) replicas of the pool scale-up would
  grow first; without a shortfall the deadline needs the fewest replicas of the current mean rate that meet
  it. Only deadlines more than SLACK_MIN_S after a cold start count (a closer one is past helping, and
  draining replicas finish their own work). desired = max(the other triggers, the most any deadline needs;
  at least one replica while deferrable work is left), then bounded like the others (x2 or +4 per tick,
  300 s scale-down stabilization, the plan's floors and ceilings).
- ``legacy``: the trigger before v1, bit for bit: waiting = queued interactive + admitted sequences before
  their first token + queued deferrable work (unless admission is HOLD), all into the backlog trigger.

Telemetry's num_requests_waiting per replica (logs.tel_waiting) follows the selected semantics: v1, the model's
front-end queues (interactive + deferrable) plus the replica's own unscheduled sequences; legacy, the model's
interactive queue length.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from worldmodel.groundtruth.replica import credit_busy, slowdown
from worldmodel.groundtruth.state import (
    ADM_HOLD,
    C_BASE,
    C_IDLE,
    C_KV,
    C_KVCAP,
    C_LOAD,
    C_MAXP,
    C_PATTN,
    C_PTOK,
    C_SEQ,
    DRAINING,
    EV_READY,
    EV_STARTED,
    EV_STOPPED,
    LOADING,
    OFF,
    S_ADMISSION,
    S_AS_TARGET,
    S_AS_TICK,
    S_AUTOSCALE,
    S_DEC_0,
    S_DEC_BATCH,
    S_DEC_BW,
    S_DEC_SHIFT,
    S_DONE_PTR,
    S_DOUT_N,
    S_DOUT_SUM,
    S_GAMMA,
    S_LOAD_POWER_FRAC,
    S_N_SITES,
    S_NODE_OVERHEAD_A100,
    S_NODE_OVERHEAD_H100,
    S_RELEASE_MARGIN,
    S_SCALER_TRIGGER,
    SCALER_LEGACY,
    TEL_DT,
    WARM,
    Hardware,
    Logs,
    Pools,
    Queues,
    Replicas,
    Requests,
)
from worldmodel.physics.power import A_PREFILL, decode_activity_at
from worldmodel.physics.tables import HBM_EFFICIENCY

STABILIZATION_TICKS = 20  # 300 s of 15 s ticks
# power model constants (worldmodel.physics.power), frozen into the compiled code (the decode fit is in sf)
_A_PREFILL = A_PREFILL.value
_HBM_EFF = HBM_EFFICIENCY
#: Telemetry GPU temperature (C) = _TEMP_C0 + _TEMP_C_PER_W x board power: a line through the project's H200
#: phases (37 C at 129 W idle, 53 C at 664 W decode, 58 C at 693 W prefill; 8 s phases, not steady state).
#: Display only: no thermal effect on speed is modeled (none with a cited magnitude).
_TEMP_C0, _TEMP_C_PER_W = 32.6, 0.034
TOLERANCE = 0.1
WAITING_PER_REPLICA = 5.0  # KEDA threshold on vllm:num_requests_waiting (REFERENCES.md)
# Deferrable slack trigger (v1). Modeling choices, not measurements:
DEFERRABLE_OUT_PRIOR = 512.0  # tokens: prior output length of deferrable work (assumed; not fitted to the traces)
DEFERRABLE_OUT_PRIOR_N = 10.0  # completions the prior weighs in the running mean
SLACK_MIN_S = 60.0  # s: a scale-up must leave at least this much useful time before a deadline to count
SLACK_BINS = 64  # deadline bins: [0, 30 s), then x1.25 each (up to ~460 days); each bin's first and last
SLACK_BIN0_S = 30.0  # deadline give exact prefix checks, the ones in between are within the bin ratio
SLACK_BIN_RATIO = 1.25


@njit(cache=True, _nrt=False)
def log_event(logs: Logs, t: float, r: int, kind: int, g0: int) -> None:
    k = logs.n_ev[0]
    if k < logs.ev_t.shape[0]:
        logs.ev_t[k] = t
        logs.ev_rep[k] = r
        logs.ev_kind[k] = kind
        logs.ev_gpu0[k] = g0
        logs.n_ev[0] = k + 1


@njit(cache=True, _nrt=False)
def allocate_gpus(hw: Hardware, site: int, gpu_type: int, tp: int, r: int) -> int:
    """First-fit an aligned block of tp free GPUs of a type on one node of a site; return the first GPU or -1."""
    g = 0
    n = hw.g_type.shape[0]
    while g + tp <= n:
        if hw.g_type[g] == gpu_type and hw.g_site[g] == site and hw.g_node[g] == hw.g_node[g + tp - 1]:
            free = True
            for k in range(tp):
                if hw.g_owner[g + k] >= 0:
                    free = False
                    break
            if free:
                for k in range(tp):
                    hw.g_owner[g + k] = r
                return g
        g += tp
    return -1


@njit(cache=True)
def start_replica(rep: Replicas, pools: Pools, hw: Hardware, logs: Logs, p: int, t: float) -> bool:
    for r in range(pools.slot_lo[p], pools.slot_hi[p]):
        if rep.state[r] == OFF:
            g0 = allocate_gpus(hw, pools.site[p], pools.gpu[p], pools.tp[p], r)
            if g0 < 0:
                return False
            rep.gpu0[r] = g0
            rep.speed[r] = hw.node_speed[hw.g_node[g0]]
            rep.state[r] = LOADING
            rep.coef[r, :] = pools.coef[p, :]
            rep.prec[r] = pools.prec[p]
            rep.ready_at[r] = t + pools.coef[p, C_LOAD]
            rep.started_at[r] = t
            rep.n[r] = 0
            rep.kv[r] = 0
            rep.cache[r, :] = -1
            rep.busy_acc[r] = 0.0
            rep.busy_mark[r] = t
            log_event(logs, t, r, EV_STARTED, g0)
            return True
    return False


@njit(cache=True, _nrt=False)
def stop_replica(rep: Replicas, hw: Hardware, logs: Logs, r: int, t: float) -> None:
    g0 = rep.gpu0[r]
    if g0 >= 0:
        for g in range(hw.g_owner.shape[0]):
            if hw.g_owner[g] == r:
                hw.g_owner[g] = -1
    rep.gpu0[r] = -1
    rep.state[r] = OFF
    rep.stepping[r] = 0
    rep.version[r] += 1
    log_event(logs, t, r, EV_STOPPED, g0)


@njit(cache=True, _nrt=False)
def pool_count(rep: Replicas, pools: Pools, p: int) -> int:
    c = 0
    for r in range(pools.slot_lo[p], pools.slot_hi[p]):
        if rep.state[r] == WARM or rep.state[r] == LOADING:
            c += 1
    return c


@njit(cache=True, _nrt=False)
def drain_one(rep: Replicas, pools: Pools, hw: Hardware, logs: Logs, p: int, t: float) -> None:
    """Mark the least-busy replica of pool p draining (loading ones are stopped at once)."""
    best = -1
    best_n = 1 << 30
    for r in range(pools.slot_lo[p], pools.slot_hi[p]):
        if rep.state[r] == LOADING:
            stop_replica(rep, hw, logs, r, t)
            return
        if rep.state[r] == WARM and rep.n[r] < best_n:
            best_n = rep.n[r]
            best = r
    if best >= 0:
        rep.state[best] = DRAINING
        if rep.n[best] == 0 and rep.stepping[best] == 0:
            stop_replica(rep, hw, logs, best, t)


@njit(cache=True, _nrt=False)
def _share(allowed: int, site: int, every: int) -> float:
    """A waiting request's share of one site's backlog: 1 / its allowed sites, 0 if the site is not one."""
    a = allowed & every
    if (a >> site) & 1 == 0:
        return 0.0
    n = 0
    while a:
        n += a & 1
        a >>= 1
    return 1.0 / n


@njit(cache=True, _nrt=False)
def unscheduled(rep: Replicas, req: Requests, r: int, k: int) -> bool:
    """Whether the sequence in slot k of replica r has not been scheduled since it joined (vLLM V1 keeps it in
    `waiting`): its prefill has not started (prompt left = its whole uncached prompt, or prompt + generated
    tokens after a preemption) and the iteration in flight gives it no chunk."""
    i = rep.seqs[r, k]
    if req.prefill_left[i] <= 0:
        return False
    if rep.stepping[r] == 1 and rep.active[r, k] == 1 and rep.chunk[r, k] > 0:
        return False
    full = req.inp[i] - req.cached[i] if req.preempted[i] == 0 else req.inp[i] + req.gen[i]
    return req.prefill_left[i] == full


@njit(cache=True, _nrt=False)
def replica_unscheduled(rep: Replicas, req: Requests, r: int) -> int:
    """Sequences admitted to replica r and not yet scheduled (its own part of vLLM V1's num_requests_waiting)."""
    c = 0
    for k in range(rep.n[r]):
        if unscheduled(rep, req, r, k):
            c += 1
    return c


@njit(cache=True, _nrt=False)
def waiting_gauge(rep: Replicas, pools: Pools, req: Requests, q: Queues, si: np.ndarray, r: int) -> int:
    """num_requests_waiting reported by replica r: v1, the model's front-end queues (interactive and
    deferrable) plus r's own unscheduled sequences; legacy, the model's interactive queue length."""
    m = pools.model[rep.pool[r]]
    if si[S_SCALER_TRIGGER] == SCALER_LEGACY:
        return q.itail[m] - q.ihead[m]
    return q.itail[m] - q.ihead[m] + q.bn[m] + replica_unscheduled(rep, req, r)


@njit(cache=True, _nrt=False)
def model_waiting(rep: Replicas, pools: Pools, req: Requests, q: Queues, si: np.ndarray, m: int, site: int) -> float:
    """Requests of model m not yet scheduled at one site (every class; a queued request allowed at n sites counts
    1/n at each): the front-end queues plus admitted sequences not yet scheduled. legacy: the old count."""
    if si[S_SCALER_TRIGGER] == SCALER_LEGACY:
        return model_demand(rep, pools, req, q, si, m, site)[6]
    waiting = 0.0
    for r in range(rep.n.shape[0]):
        if rep.state[r] == WARM and pools.model[rep.pool[r]] == m and pools.site[rep.pool[r]] == site:
            waiting += replica_unscheduled(rep, req, r)
    n_sites = si[S_N_SITES]
    every = (1 << n_sites) - 1
    cap = q.iq.shape[1]
    for k in range(q.ihead[m], q.itail[m]):
        waiting += 1.0 if n_sites <= 1 else _share(req.allowed[q.iq[m, k % cap]], site, every)
    for k in range(q.bn[m]):
        waiting += 1.0 if n_sites <= 1 else _share(req.allowed[q.bq[m, k]], site, every)
    return waiting


@njit(cache=True, _nrt=False)
def model_demand(rep: Replicas, pools: Pools, req: Requests, q: Queues, si: np.ndarray, m: int, site: int) -> tuple:
    """Demand of model m at one site: (replicas warm or loading, warm replicas, warm batch slots, running, kv
    used, kv capacity, waiting, prefill share).

    pfill sums the replicas' prefill compute share. v1: running counts scheduled sequences (partially prefilled
    or decoding), waiting the interactive requests not yet scheduled (queued, or admitted without a prefill
    chunk yet); deferrable work is left to the slack trigger. legacy: running counts sequences past their
    first token, waiting the queued requests plus those admitted but not yet past prefill, and released
    deferrable work. With several sites each site's autoscaler sees its own replicas and its share of the
    queue (a request allowed at n sites counts 1/n at each)."""
    legacy = si[S_SCALER_TRIGGER] == SCALER_LEGACY
    current = 0
    slots = 0.0
    running = 0.0
    prefill_wait = 0.0
    pfill = 0.0
    n_warm = 0.0
    kv = 0.0
    kvcap = 0.0
    for r in range(rep.n.shape[0]):
        if rep.state[r] == OFF:
            continue
        p = rep.pool[r]
        if pools.model[p] != m or pools.site[p] != site or rep.state[r] == DRAINING:
            continue
        current += 1
        if rep.state[r] == WARM:
            slots += pools.max_batch[p]
            n_warm += 1.0
            pfill += rep.pfill_util[r]
            kv += rep.kv[r]
            kvcap += rep.coef[r, C_KVCAP]
            for k in range(rep.n[r]):
                if legacy:  # the old reading: requests before their first token as waiting
                    if req.gen[rep.seqs[r, k]] == 0:
                        prefill_wait += 1.0
                    else:
                        running += 1.0
                elif unscheduled(rep, req, r, k):
                    if req.cls[rep.seqs[r, k]] != 2:
                        prefill_wait += 1.0
                else:
                    running += 1.0
    n_sites = si[S_N_SITES]
    if n_sites <= 1:
        waiting = float(q.itail[m] - q.ihead[m]) + prefill_wait
        if legacy and si[S_ADMISSION] != ADM_HOLD:
            waiting += q.bn[m]
        return current, n_warm, slots, running, kv, kvcap, waiting, pfill
    every = (1 << n_sites) - 1
    waiting = prefill_wait
    cap = q.iq.shape[1]
    for k in range(q.ihead[m], q.itail[m]):
        waiting += _share(req.allowed[q.iq[m, k % cap]], site, every)
    if legacy and si[S_ADMISSION] != ADM_HOLD:
        for k in range(q.bn[m]):
            waiting += _share(req.allowed[q.bq[m, k]], site, every)
    return current, n_warm, slots, running, kv, kvcap, waiting, pfill


@njit(cache=True, _nrt=False)
def fold_completions(req: Requests, logs: Logs, sf: np.ndarray, si: np.ndarray) -> None:
    """Add the deferrable completions since the last call to each model's output running mean (S_DOUT_*).
    Reads output lengths of completed requests only."""
    n = logs.n_completed[0]
    for k in range(si[S_DONE_PTR], n):
        i = logs.completed[k]
        if req.cls[i] == 2:
            sf[S_DOUT_SUM + req.model[i]] += req.gen[i]
            sf[S_DOUT_N + req.model[i]] += 1.0
    si[S_DONE_PTR] = n


@njit(cache=True, _nrt=False)
def deferrable_out_estimate(sf: np.ndarray, m: int) -> float:
    """Expected output tokens of model m's deferrable requests: running mean of completed ones with a prior."""
    return (DEFERRABLE_OUT_PRIOR * DEFERRABLE_OUT_PRIOR_N + sf[S_DOUT_SUM + m]) / (
        DEFERRABLE_OUT_PRIOR_N + sf[S_DOUT_N + m]
    )


@njit(cache=True, _nrt=False)
def token_rate(coef: np.ndarray, max_batch: int, pre: float, out: float, ctx: float) -> float:
    """Tokens per second one replica with step coefficients coef gives a mix of requests with pre prompt
    tokens left to prefill and out output tokens left on average, at mean decode context ctx: chunked
    prefill (attention at half the prompt on average) and decode at the batch its slots and KV allow."""
    cp = coef[C_PTOK] + coef[C_PATTN] * 0.5 * pre
    b = min(float(max_batch), max(1.0, 0.95 * coef[C_KVCAP] / max(ctx, 1.0)))
    cd = (coef[C_BASE] + coef[C_SEQ] * b + coef[C_KV] * b * ctx) / b
    work_s = pre * cp + out * cd
    if work_s <= 0.0:
        return 0.0
    return (pre + out) / work_s


@njit(cache=True, _nrt=False)
def _slack_bin(x: float) -> int:
    if x < SLACK_BIN0_S:
        return 0
    return min(SLACK_BINS - 1, 1 + int(math.log(x / SLACK_BIN0_S) / math.log(SLACK_BIN_RATIO)))


@njit(cache=True)
def deferrable_slack(
    rep: Replicas, pools: Pools, req: Requests, q: Queues, sf: np.ndarray, si: np.ndarray, m: int, site: int,
    t: float,
) -> int:  # fmt: skip
    """Replicas model m needs at one site so its deferrable work meets its deadlines (the slack trigger, v1;
    the module docstring has the rule): the most any deadline prefix needs, at least one while deferrable work
    is left; 0 when there is none."""
    n_sites = si[S_N_SITES]
    every = (1 << n_sites) - 1
    out_est = deferrable_out_estimate(sf, m)
    w_bin = np.zeros(SLACK_BINS)
    x_min = np.full(SLACK_BINS, math.inf)
    w_min = np.zeros(SLACK_BINS)
    x_max = np.full(SLACK_BINS, -math.inf)
    n_items = 0.0
    sum_pre = 0.0
    sum_out = 0.0
    sum_inp = 0.0
    # (1) the work: admitted and unfinished on this site's replicas, then queued (with its share of the sites)
    hold = si[S_ADMISSION] == ADM_HOLD
    margin = sf[S_RELEASE_MARGIN]
    n_rep = rep.n.shape[0]
    for r in range(n_rep + q.bn[m]):
        if r < n_rep:
            if rep.state[r] != WARM or pools.model[rep.pool[r]] != m or pools.site[rep.pool[r]] != site:
                continue
            n_seq = rep.n[r]
        else:
            n_seq = 1
        for k in range(n_seq):
            if r < n_rep:
                i = rep.seqs[r, k]
                if req.cls[i] != 2:
                    continue
                wgt = 1.0
                pre = float(req.prefill_left[i])
            else:
                i = q.bq[m, r - n_rep]
                if hold and t < req.deadline[i] - margin:
                    continue  # held: not released before its margin
                wgt = 1.0 if n_sites <= 1 else _share(req.allowed[i], site, every)
                if wgt == 0.0:
                    continue
                pre = float(req.inp[i] + req.gen[i]) if req.preempted[i] > 0 else float(req.inp[i])
            out = max(out_est - req.gen[i], 1.0)
            w = wgt * (pre + out)
            x = req.deadline[i] - t
            b = _slack_bin(x)
            w_bin[b] += w
            if x < x_min[b]:
                x_min[b] = x
                w_min[b] = w
            x_max[b] = max(x_max[b], x)
            n_items += wgt
            sum_pre += wgt * pre
            sum_out += wgt * out
            sum_inp += wgt * req.inp[i]
    if n_items == 0.0:
        return 0
    pre_mean = sum_pre / n_items
    out_mean = sum_out / n_items
    ctx = sum_inp / n_items + 0.5 * out_est
    # (2) the capacity: warm replicas now, loading ones from their ready time; interactive sequences hold slots
    n_pools = pools.model.shape[0]
    rate = np.zeros(n_rep)
    delay = np.zeros(n_rep)
    current = 0
    rate_warm = 0.0
    n_warm = 0.0
    slots = 0.0
    inter = 0.0
    for r in range(n_rep):
        st = rep.state[r]
        if st != WARM and st != LOADING:
            continue
        p = rep.pool[r]
        if pools.model[p] != m or pools.site[p] != site:
            continue
        current += 1
        rate[r] = token_rate(rep.coef[r], pools.max_batch[p], pre_mean, out_mean, ctx)
        delay[r] = max(0.0, rep.ready_at[r] - t) if st == LOADING else 0.0
        if st == WARM:
            rate_warm += rate[r]
            n_warm += 1.0
            slots += pools.max_batch[p]
            for k in range(rep.n[r]):
                if req.cls[rep.seqs[r, k]] != 2:
                    inter += 1.0
    inter_rate = rate_warm * inter / slots if slots > 0 else 0.0  # tokens/s the interactive sequences take
    # the pool scale-up grows first (place_desired: lowest priority value with room under its ceiling)
    p_new = -1
    load_new = 0.0
    for p in range(n_pools):
        if pools.model[p] == m and pools.site[p] == site:
            load_new = max(load_new, pools.coef[p, C_LOAD])
            if pool_count(rep, pools, p) < pools.ceil[p] and (p_new < 0 or pools.priority[p] < pools.priority[p_new]):
                p_new = p
    target = sf[S_AS_TARGET] if sf[S_AS_TARGET] > 0 else 1.0
    rate_new = 0.0
    if p_new >= 0:
        load_new = pools.coef[p_new, C_LOAD]
        rate_new = token_rate(pools.coef[p_new], pools.max_batch[p_new], pre_mean, out_mean, ctx) * target
    rate_mean = 0.0
    for r in range(n_rep):
        rate_mean += rate[r]
    rate_mean = rate_mean / current if current > 0 else 0.0
    # (3) each deadline prefix (earliest and latest deadline of every bin): the replicas it needs; with the
    # current ones short, current + the replicas that close the shortfall after their cold start; else the
    # fewest replicas of the current mean rate that meet it (so the trigger never holds an idle fleet up)
    need = 1 if current == 0 else 0
    cum = 0.0
    for b in range(SLACK_BINS):
        if w_bin[b] == 0.0:
            continue
        for side in range(2):
            x = x_min[b] if side == 0 else x_max[b]
            work = cum + (w_min[b] if side == 0 else w_bin[b])
            useful = x - load_new
            if useful <= SLACK_MIN_S:
                continue
            cap = 0.0
            for r in range(n_rep):
                if rate[r] > 0.0 and x > delay[r]:
                    cap += rate[r] * (x - delay[r])
            cap = max(0.0, cap - inter_rate * x) * target
            if work > cap:
                n = current
                if rate_new > 0.0:
                    n += int(math.ceil((work - cap) / (rate_new * useful)))
            else:
                n = int(math.ceil((work / target + inter_rate * x) / (rate_mean * x)))
            need = max(need, n)
        cum += w_bin[b]
    return need


@njit(cache=True)
def autoscale_tick(
    rep: Replicas,
    pools: Pools,
    req: Requests,
    q: Queues,
    hw: Hardware,
    logs: Logs,
    sf: np.ndarray,
    si: np.ndarray,
    t: float,
) -> None:
    """HPA-like control per model and site (one autoscaler per site, as each region deploys its own), then
    placement of the desired count onto the site's pools by priority."""
    n_models = q.bn.shape[0]
    n_pools = pools.model.shape[0]
    n_sites = si[S_N_SITES]
    tick = si[S_AS_TICK]
    si[S_AS_TICK] = tick + 1
    target = sf[S_AS_TARGET]
    legacy = si[S_SCALER_TRIGGER] == SCALER_LEGACY
    if not legacy:
        fold_completions(req, logs, sf, si)
    for m in range(n_models):
        for site in range(n_sites):
            floor_sum = 0
            ceil_sum = 0
            present = False
            for p in range(n_pools):
                if pools.model[p] == m and pools.site[p] == site:
                    floor_sum += pools.floor[p]
                    ceil_sum += pools.ceil[p]
                    present = True
            if not present:
                continue
            current, n_warm, slots, running, kv, kvcap, waiting, pfill = model_demand(rep, pools, req, q, si, m, site)
            if si[S_AUTOSCALE] == 1:
                slack = 0 if legacy else deferrable_slack(rep, pools, req, q, sf, si, m, site, t)
                if slots > 0:
                    # utilization: batch-slot occupancy plus the share of time spent in compute-bound prefill
                    u = max(running / slots + pfill / n_warm, kv / max(kvcap, 1.0))
                    warm = current
                    ratio = u / target
                    if abs(ratio - 1.0) <= TOLERANCE:
                        desired = current
                    else:
                        desired = int(math.ceil(warm * ratio))
                    # KEDA-style backlog trigger on vllm:num_requests_waiting (threshold per replica)
                    backlog = int(math.ceil(waiting / WAITING_PER_REPLICA))
                    if backlog > current:
                        desired = max(desired, backlog)
                else:
                    desired = current if (running + waiting) == 0 else max(current, 1)
                desired = max(desired, slack)  # v1: deferrable work's deadline slack (0 under legacy)
                desired = min(desired, max(2 * current, current + 4))
                g = m * n_sites + site
                pools.desired_hist[g, tick % STABILIZATION_TICKS] = desired
                if desired < current:
                    hist_max = 0
                    for k in range(STABILIZATION_TICKS):
                        hist_max = max(hist_max, pools.desired_hist[g, k])
                    desired = min(current, hist_max)
            else:
                desired = floor_sum
            desired = max(floor_sum, min(ceil_sum, desired))
            place_desired(rep, pools, hw, logs, m, site, desired, t)


@njit(cache=True)
def place_desired(
    rep: Replicas, pools: Pools, hw: Hardware, logs: Logs, m: int, site: int, desired: int, t: float
) -> None:
    """Split a model's desired replicas at a site over its pools there: floors, then keep existing, then grow by
    priority."""
    n_pools = pools.model.shape[0]
    target = np.zeros(n_pools, np.int64)
    left = desired
    for p in range(n_pools):
        if pools.model[p] == m and pools.site[p] == site:
            target[p] = pools.floor[p]
            left -= pools.floor[p]
    for phase in range(2):
        for pr in range(n_pools):  # priority order: smallest priority value first
            for p in range(n_pools):
                if pools.model[p] != m or pools.site[p] != site or pools.priority[p] != pr or left <= 0:
                    continue
                cap = pools.ceil[p] if phase == 1 else min(pools.ceil[p], pool_count(rep, pools, p))
                add = min(left, max(0, cap - target[p]))
                target[p] += add
                left -= add
    for p in range(n_pools):
        if pools.model[p] != m or pools.site[p] != site:
            continue
        cur = pool_count(rep, pools, p)
        while cur < target[p]:
            if not start_replica(rep, pools, hw, logs, p, t):
                break
            cur += 1
        while cur > target[p]:
            drain_one(rep, pools, hw, logs, p, t)
            cur -= 1


@njit(cache=True, _nrt=False)
def decode_hbm_util(rep: Replicas, pools: Pools, r: int) -> float:
    """HBM bandwidth utilization (0-1) of replica r's decode step at its current batch and KV.

    Bytes read per GPU per step at the datasheet bandwidth (the weight shard, w_read_s, plus the batch's KV at
    the KV coefficient's roofline share, HBM_EFFICIENCY) over the step's modeled time."""
    c = rep.coef[r]
    n = max(rep.n[r], 1)
    _, memory = slowdown(rep, r)
    t_step = (c[C_BASE] + c[C_SEQ] * n + c[C_KV] * rep.kv[r]) * memory
    if t_step <= 0.0:
        return 0.0
    return min(1.0, (pools.w_read_s[rep.pool[r]] + _HBM_EFF * c[C_KV] * rep.kv[r]) / t_step)


@njit(cache=True)
def telemetry_tick(
    rep: Replicas,
    pools: Pools,
    req: Requests,
    q: Queues,
    hw: Hardware,
    logs: Logs,
    sf: np.ndarray,
    si: np.ndarray,
    t: float,
) -> None:
    """Sample every live replica (DCGM-style), advance lifecycle state, run each site's power-cap loop.

    Power per GPU follows worldmodel.physics.power: the tick's prefill share draws near the limit at the clock
    the power limit allows (a clock target above it changes nothing), its decode share by the step's HBM
    utilization and batch. The reported SM clock is the tick's time-weighted mean (prefill held at
    min(f, f_pl)); the temperature is a display-only function of power."""
    n_sites = hw.site_cap_w.shape[0]
    site_w = np.zeros(n_sites)
    gpus = np.zeros(n_sites)
    loading = np.zeros(n_sites)
    gamma = sf[S_GAMMA]
    dec_0, dec_bw, dec_batch = sf[S_DEC_0], sf[S_DEC_BW], sf[S_DEC_BATCH]  # plan-wide decode-power fit
    n_nodes = hw.node_speed.shape[0]
    node_on = np.zeros(n_nodes, np.int64)
    for r in range(rep.n.shape[0]):
        st = rep.state[r]
        if st == OFF:
            continue
        p = rep.pool[r]
        s = pools.site[p]
        if rep.stepping[r] == 1:
            credit_busy(rep, r, t)
        util = min(1.0, rep.busy_acc[r] / TEL_DT)
        rep.busy_acc[r] = 0.0
        rep.pfill_util[r] = min(1.0, rep.pfill_acc[r] / TEL_DT)
        rep.pfill_acc[r] = 0.0
        pf = min(util, rep.pfill_util[r])  # prefill is credited at step end, busy time as it runs
        rep.thr[r] = hw.site_throttle[s]
        f_set = pools.clock[p] * rep.thr[r]
        f_pl = pools.clock_pl[p]
        rep.thr_cmp[r] = min(f_set, f_pl) / min(pools.clock[p], f_pl)
        fmax = pools.clock_max[p]
        if st == LOADING:
            act = sf[S_LOAD_POWER_FRAC] * (f_set / fmax) ** gamma
            clock_eff = f_set
        else:
            a_dec = decode_activity_at(dec_0, sf[S_DEC_SHIFT + pools.gpu[p]], dec_bw, dec_batch,
                                       decode_hbm_util(rep, pools, r), float(rep.n[r]))
            act = pf * _A_PREFILL * (min(f_set, f_pl) / f_pl) ** gamma + (util - pf) * a_dec * (f_set / fmax) ** gamma
            clock_eff = f_set - pf * max(0.0, f_set - f_pl)
        idle = rep.coef[r, C_IDLE]
        p_gpu = idle + (rep.coef[r, C_MAXP] - idle) * act
        tp = pools.tp[p]
        site_w[s] += p_gpu * tp
        gpus[s] += tp
        if st == LOADING:
            loading[s] += tp
        node_on[hw.g_node[rep.gpu0[r]]] = 1
        k = logs.n_tel[0]
        if k < logs.tel_t.shape[0]:
            logs.tel_t[k] = t
            logs.tel_rep[k] = r
            logs.tel_power_w[k] = p_gpu
            logs.tel_util[k] = util if st != LOADING else 0.0
            logs.tel_clock[k] = clock_eff
            logs.tel_kv[k] = rep.kv[r] / max(rep.coef[r, C_KVCAP], 1.0)
            unsched = replica_unscheduled(rep, req, r) if si[S_SCALER_TRIGGER] != SCALER_LEGACY else 0
            logs.tel_running[k] = rep.n[r] - unsched  # v1: scheduled sequences only (vLLM V1's running)
            logs.tel_waiting[k] = waiting_gauge(rep, pools, req, q, si, r)
            logs.tel_temp[k] = _TEMP_C0 + _TEMP_C_PER_W * p_gpu
            logs.tel_state[k] = st
            logs.tel_gpu0[k] = rep.gpu0[r]
            logs.n_tel[0] = k + 1
        if st == LOADING and t >= rep.ready_at[r]:
            rep.state[r] = WARM
            log_event(logs, t, r, EV_READY, rep.gpu0[r])
        elif st == DRAINING and rep.n[r] == 0 and rep.stepping[r] == 0:
            stop_replica(rep, hw, logs, r, t)
    for nd in range(n_nodes):
        if node_on[nd] == 1:
            site_w[hw.node_site[nd]] += sf[S_NODE_OVERHEAD_H100] if hw.node_type[nd] == 0 else sf[S_NODE_OVERHEAD_A100]
    for s in range(n_sites):
        k = logs.n_site[0]
        if k < logs.site_t.shape[0]:
            logs.site_t[k] = t
            logs.site_it_w[k] = site_w[s]
            logs.site_gpus[k] = gpus[s]
            logs.site_gpus_loading[k] = loading[s]
            logs.site_idx[k] = s
            logs.n_site[0] = k + 1
        cap = hw.site_cap_w[s]
        if site_w[s] > cap:
            hw.site_throttle[s] = max(0.5, hw.site_throttle[s] * 0.95)
        elif site_w[s] < 0.97 * cap and hw.site_throttle[s] < 1.0:
            hw.site_throttle[s] = min(1.0, hw.site_throttle[s] * 1.02)
