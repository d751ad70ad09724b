"""Compiled per-replica serving: continuous batching with chunked prefill, event-to-event decode jumps,
prefix cache, KV limits and preemption.

A replica runs either one mixed iteration (prefill chunks + one decode token per running sequence) or,
when nothing is left to prefill, a jump of k identical decode steps up to its next completion. Between
events the batch is fixed, so the hot loop advances per event, not per token.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from worldmodel.groundtruth.state import (
    C_BASE,
    C_KV,
    C_KVCAP,
    C_PATTN,
    C_PTOK,
    C_SEQ,
    C_TOKENS,
    CACHE_SLOTS,
    MAX_BATCH,
    Replicas,
    Requests,
)
from worldmodel.physics.clock import DECODE_CLOCK_EXPONENT

BLOCK_TOKENS = 512
_DECODE_EXP = DECODE_CLOCK_EXPONENT.value


@njit(cache=True, _nrt=False)
def slowdown(rep: Replicas, r: int) -> tuple:
    """Hidden multipliers (compute-bound, memory-bound) from node variation and the site power cap.

    Compute-bound work slows only once the cap pulls the clock below the power-limited clock it already held
    (thr_cmp); memory-bound work by the clock share to the decode clock exponent (worldmodel.physics.clock)."""
    compute = rep.speed[r] / rep.thr_cmp[r]
    memory = rep.speed[r] * (1.0 / rep.thr[r]) ** _DECODE_EXP
    return compute, memory


@njit(cache=True, _nrt=False)
def iteration_time(
    rep: Replicas, r: int, n_dec: int, kv_tokens: float, p_tok: float, p_attn: float
) -> float:
    """Wall time (s) of one iteration with n_dec decode sequences and p_tok prefill tokens."""
    c = rep.coef[r]
    compute, memory = slowdown(rep, r)
    t_mem = c[C_BASE] + c[C_SEQ] * n_dec + c[C_KV] * kv_tokens
    t_cmp = c[C_PTOK] * p_tok + c[C_PATTN] * p_attn
    return t_mem * memory + t_cmp * compute


@njit(cache=True, _nrt=False)
def credit_busy(rep: Replicas, r: int, t: float) -> None:
    """Credit replica r's in-flight iteration time up to t to its current telemetry tick (s)."""
    start = max(rep.step_start[r], rep.busy_mark[r])
    if t > start:
        rep.busy_acc[r] += t - start
    rep.busy_mark[r] = t


@njit(cache=True, _nrt=False)
def cache_lookup(rep: Replicas, r: int, req: Requests, i: int) -> int:
    """Leading prefix blocks of request i resident in replica r's cache."""
    off = req.pfx_off[i]
    m = 0
    for b in range(req.pfx_len[i]):
        blk = req.pfx_blocks[off + b]
        if rep.cache[r, blk % CACHE_SLOTS] != blk:
            break
        m += 1
    return m


@njit(cache=True, _nrt=False)
def cache_insert(rep: Replicas, r: int, req: Requests, i: int) -> None:
    off = req.pfx_off[i]
    for b in range(req.pfx_len[i]):
        blk = req.pfx_blocks[off + b]
        rep.cache[r, blk % CACHE_SLOTS] = blk


@njit(cache=True, _nrt=False)
def join(rep: Replicas, r: int, req: Requests, i: int, t: float) -> None:
    """Add request i to replica r's running set (it takes part from the next iteration)."""
    k = rep.n[r]
    rep.seqs[r, k] = i
    rep.active[r, k] = 0
    rep.chunk[r, k] = 0
    rep.n[r] = k + 1
    req.rep[i] = r
    if req.preempted[i] == 0:
        req.dispatched[i] = t
        hit = cache_lookup(rep, r, req, i) * BLOCK_TOKENS
        if hit >= req.inp[i]:
            hit = req.inp[i] - 1
        req.cached[i] = hit
        req.prefill_left[i] = req.inp[i] - hit
    else:
        req.prefill_left[i] = req.inp[i] + req.gen[i]  # recompute after preemption
    rep.kv[r] += req.inp[i] + req.gen[i]


@njit(cache=True, _nrt=False)
def has_room(rep: Replicas, r: int, max_batch: int, req: Requests, i: int) -> bool:
    """Free batch slot and KV (95% watermark) for request i's prompt."""
    if rep.n[r] >= max_batch or rep.n[r] >= MAX_BATCH:
        return False
    return rep.kv[r] + req.inp[i] <= 0.95 * rep.coef[r, C_KVCAP]


@njit(cache=True, _nrt=False)
def remove_at(rep: Replicas, r: int, k: int) -> None:
    """Remove slot k keeping admission order (prefill chunks are handed out first come, first served)."""
    last = rep.n[r] - 1
    for j in range(k, last):
        rep.seqs[r, j] = rep.seqs[r, j + 1]
        rep.active[r, j] = rep.active[r, j + 1]
        rep.chunk[r, j] = rep.chunk[r, j + 1]
    rep.n[r] = last


@njit(cache=True, _nrt=False)
def plan_step(rep: Replicas, r: int, req: Requests, sf: np.ndarray, t: float, edf: bool) -> float:
    """Compose the next iteration of replica r at time t; return its end time (inf when idle).

    Mixed iteration if any active sequence has prompt left to prefill, else a decode jump to the next
    completion. Sets active/chunk flags, jump_k and the step window.
    """
    n = rep.n[r]
    if n == 0:
        rep.stepping[r] = 0
        return math.inf
    budget = rep.coef[r, C_TOKENS]  # the engine's max_num_batched_tokens for the pool's GPU type
    n_dec = 0
    p_tok = 0.0
    p_attn = 0.0
    kv_tokens = 0.0
    min_left = 1 << 40
    # EDF: interactive prompts take the prefill budget before deferrable ones; FCFS: admission order
    for ps in range(2 if edf else 1):
        for k in range(n):
            i = rep.seqs[r, k]
            deferred_prompt = edf and req.cls[i] == 2 and req.prefill_left[i] > 0
            if ps == 0 and deferred_prompt:
                continue
            if ps == 1 and not deferred_prompt:
                continue
            rep.active[r, k] = 1
            ctx = req.inp[i] + req.gen[i]
            if req.prefill_left[i] > 0:
                c = min(req.prefill_left[i], int(budget - p_tok))
                if c < 0:
                    c = 0
                rep.chunk[r, k] = c
                if c > 0:
                    done_before = ctx - req.prefill_left[i]
                    p_tok += c
                    p_attn += c * (done_before + 0.5 * c)
                    kv_tokens += done_before
                else:
                    rep.active[r, k] = 0
            else:
                rep.chunk[r, k] = 0
                n_dec += 1
                kv_tokens += ctx
                left = req.out[i] - req.gen[i]
                if left < min_left:
                    min_left = left
    rep.stepping[r] = 1
    rep.step_start[r] = t
    if p_tok > 0.0 or n_dec == 0:
        rep.jump_k[r] = 0
        dt = iteration_time(rep, r, n_dec, kv_tokens, p_tok, p_attn)
        rep.step_cmp[r] = dt - iteration_time(rep, r, n_dec, kv_tokens, 0.0, 0.0)
    else:
        # decode jump: k steps, context growing by n_dec tokens per step
        k_steps = max(1, min_left)
        room = rep.coef[r, C_KVCAP] - rep.kv[r]
        if room < n_dec * k_steps:
            k_steps = max(1, int(room // max(n_dec, 1)))
        rep.jump_k[r] = k_steps
        rep.step_cmp[r] = 0.0
        c = rep.coef[r]
        _, memory = slowdown(rep, r)
        dt0 = iteration_time(rep, r, n_dec, kv_tokens, 0.0, 0.0)
        dt = k_steps * dt0 + c[C_KV] * memory * n_dec * k_steps * (k_steps - 1) * 0.5
    rep.step_end[r] = t + dt
    return t + dt


@njit(cache=True, _nrt=False)
def truncate_jump(rep: Replicas, r: int, t: float) -> float:
    """Cut replica r's decode jump at the first step boundary after t; return the new end time."""
    k = rep.jump_k[r]
    if k <= 1 or rep.stepping[r] == 0:
        return rep.step_end[r]
    span = rep.step_end[r] - rep.step_start[r]
    per = span / k
    done = int(math.ceil((t - rep.step_start[r]) / per - 1e-9))
    if done < 1:
        done = 1
    if done >= k:
        return rep.step_end[r]
    rep.jump_k[r] = done
    rep.step_end[r] = rep.step_start[r] + done * per
    return rep.step_end[r]


@njit(cache=True, _nrt=False)
def finish_step(
    rep: Replicas, r: int, req: Requests, t: float, completed: np.ndarray, n_completed: np.ndarray
) -> int:
    """Apply the effects of replica r's iteration or jump ending at t; return completions."""
    k_steps = rep.jump_k[r]
    n_done = 0
    k = 0
    while k < rep.n[r]:
        if rep.active[r, k] == 0:
            k += 1
            continue
        i = rep.seqs[r, k]
        if k_steps > 0:
            req.gen[i] += k_steps
            rep.kv[r] += k_steps
        elif rep.chunk[r, k] > 0:
            req.prefill_left[i] -= rep.chunk[r, k]
            if req.prefill_left[i] <= 0:
                req.prefill_left[i] = 0
                cache_insert(rep, r, req, i)
                if req.gen[i] == 0:
                    req.first[i] = t
                    req.gen[i] = 1
                    rep.kv[r] += 1
        else:
            req.gen[i] += 1
            rep.kv[r] += 1
        if req.gen[i] >= req.out[i] and req.prefill_left[i] == 0:
            req.done[i] = t
            rep.kv[r] -= req.inp[i] + req.gen[i]
            completed[n_completed[0]] = i
            n_completed[0] += 1
            n_done += 1
            remove_at(rep, r, k)
            continue
        k += 1
    rep.stepping[r] = 0
    return n_done


@njit(cache=True, _nrt=False)
def preempt_if_full(rep: Replicas, r: int, req: Requests) -> int:
    """Preempt the newest sequences while KV use exceeds capacity; return the first preempted id or -1.

    Preempted requests keep their generated tokens and recompute their context when readmitted (vLLM's
    recompute preemption); the caller puts them back at the head of their queue.
    """
    if rep.kv[r] <= rep.coef[r, C_KVCAP] or rep.n[r] <= 1:
        return -1
    k = rep.n[r] - 1
    i = rep.seqs[r, k]
    rep.kv[r] -= req.inp[i] + req.gen[i]
    remove_at(rep, r, k)
    req.preempted[i] += 1
    req.rep[i] = -1
    return i
