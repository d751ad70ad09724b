"""Compiled reconfiguration: a change of weight precision or KV-cache dtype restarts a replica's engine (vLLM
takes both at start-up: it reloads the weights and re-profiles the KV cache); its sequences are requeued."""

from __future__ import annotations

import numpy as np
from numba import njit

from worldmodel.groundtruth.engine import enqueue
from worldmodel.groundtruth.scaler import log_event
from worldmodel.groundtruth.state import (
    C_LOAD,
    EV_RECONFIGURED,
    LOADING,
    Logs,
    Pools,
    Queues,
    Replicas,
    Requests,
)


@njit(cache=True)
def reload_replica(
    rep: Replicas, pools: Pools, req: Requests, q: Queues, logs: Logs, si: np.ndarray, r: int, t: float
) -> None:
    """Requeue replica r's sequences (recompute later), then hold its GPUs loading the pool's planned precision
    code (weights and KV dtype) for the pool's load time."""
    for k in range(rep.n[r]):
        i = rep.seqs[r, k]
        req.preempted[i] += 1
        req.rep[i] = -1
        enqueue(req, q, si, i, True)
    p = rep.pool[r]
    rep.n[r] = 0
    rep.kv[r] = 0
    rep.stepping[r] = 0
    rep.version[r] += 1
    rep.cache[r, :] = -1
    rep.coef[r, :] = pools.coef[p, :]
    rep.prec[r] = pools.prec[p]
    rep.state[r] = LOADING
    rep.ready_at[r] = t + pools.coef[p, C_LOAD]
    log_event(logs, t, r, EV_RECONFIGURED, rep.gpu0[r])
