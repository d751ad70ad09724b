"""Residency for the three-site mode: a seeded share of each class's requests belongs to tenants that may
run in one region only (the others may run anywhere)."""

from __future__ import annotations

import numpy as np
import polars as pl

from streams.workload.builder import rng


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
