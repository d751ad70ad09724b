"""Residency for the three-site mode: a seeded share of each class's requests belongs to tenants that may
run in one region only (the others may run anywhere)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from schemas.fleet import FleetSpec
from streams.workload.builder import Workload, rng


def assign_residency(
    requests: pl.DataFrame, regions: tuple[str, ...], market: str, pinned_share: float = 0.3, seed: int = 0
) -> pl.DataFrame:
    """Pin `pinned_share` of requests (seeded) to one region each, uniformly over `regions`.

    Pinned requests get tenant ``<tenant>-<region>`` and allowed_regions ``[region]``; the rest keep theirs.
    """
    gen = rng(seed, "residency", market)
    n = requests.height
    pinned = gen.random(n) < pinned_share
    region = np.asarray(regions)[gen.integers(0, len(regions), n)]
    return requests.with_columns(
        pl.when(pl.Series(pinned))
        .then(pl.col("tenant") + "-" + pl.Series(region))
        .otherwise(pl.col("tenant"))
        .alias("tenant"),
        pl.when(pl.Series(pinned))
        .then(pl.concat_list(pl.Series(region)))
        .otherwise(pl.col("allowed_regions"))
        .alias("allowed_regions"),
    )


def with_residency(wl: Workload, fleet: FleetSpec, market: str, seed: int = 0) -> Workload:
    """`wl` with its requests pinned over `fleet`'s regions (`assign_residency`): the three-site mode's workload."""
    return replace(wl, requests=assign_residency(wl.requests, tuple(s.region for s in fleet.sites), market, seed=seed))
