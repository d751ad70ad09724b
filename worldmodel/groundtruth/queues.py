"""Compiled queue primitives: the event heap, per-model FIFO deques and deferrable-work heaps."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def heap_push(ht: np.ndarray, hr: np.ndarray, hv: np.ndarray, n: int, t: float, r: int, v: int) -> int:
    """Push event (t, replica r, version v) onto a binary min-heap of size n; return the new size."""
    i = n
    ht[i] = t
    hr[i] = r
    hv[i] = v
    while i > 0:
        parent = (i - 1) >> 1
        if ht[parent] <= ht[i]:
            break
        ht[parent], ht[i] = ht[i], ht[parent]
        hr[parent], hr[i] = hr[i], hr[parent]
        hv[parent], hv[i] = hv[i], hv[parent]
        i = parent
    return n + 1


@njit(cache=True)
def heap_pop(ht: np.ndarray, hr: np.ndarray, hv: np.ndarray, n: int) -> int:
    """Remove the heap's top (caller read it at index 0); return the new size."""
    n -= 1
    ht[0] = ht[n]
    hr[0] = hr[n]
    hv[0] = hv[n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and ht[left + 1] < ht[left]:
            c = left + 1
        if ht[i] <= ht[c]:
            break
        ht[c], ht[i] = ht[i], ht[c]
        hr[c], hr[i] = hr[i], hr[c]
        hv[c], hv[i] = hv[i], hv[c]
        i = c
    return n


@njit(cache=True)
def keyed_push(q: np.ndarray, key: np.ndarray, n: int, item: int, k: float) -> int:
    """Push item with key k onto the min-heap (q, key) of size n; return the new size."""
    i = n
    q[i] = item
    key[i] = k
    while i > 0:
        parent = (i - 1) >> 1
        if key[parent] <= key[i]:
            break
        key[parent], key[i] = key[i], key[parent]
        q[parent], q[i] = q[i], q[parent]
        i = parent
    return n + 1


@njit(cache=True)
def keyed_pop(q: np.ndarray, key: np.ndarray, n: int) -> int:
    """Remove the top of the keyed heap; return the new size."""
    n -= 1
    q[0] = q[n]
    key[0] = key[n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and key[left + 1] < key[left]:
            c = left + 1
        if key[i] <= key[c]:
            break
        key[c], key[i] = key[i], key[c]
        q[c], q[i] = q[i], q[c]
        i = c
    return n
