"""Compiled binary min-heap keyed by float, used for the event heap (key: end time, s) and the deferrable-work
queues (key: deadline or arrival, s)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, _nrt=False)
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


@njit(cache=True, _nrt=False)
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
