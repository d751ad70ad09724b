"""Per-request traces: Azure LLM inference 2023 (code, conversation) and Mooncake FAST'25 conversation.

Rows keep the trace's own order (its time order); the workload builder cycles through them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import polars as pl

from streams.datasets.paths import data_dir

AZURE_KINDS = ("code", "conv")


@lru_cache(maxsize=4)
def _azure(root: Path, kind: str) -> pl.DataFrame:
    path = root / "traces" / "azure_llm_2023" / f"AzureLLMInferenceTrace_{kind}.csv.gz"
    schema = {"TIMESTAMP": pl.Utf8, "ContextTokens": pl.Int32, "GeneratedTokens": pl.Int32}
    raw = pl.read_csv(path, schema=schema)
    # 7 fractional digits: cut to microseconds; the trace's time zone is unstated, read as UTC
    ts = pl.col("TIMESTAMP").str.slice(0, 26).str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="us")
    return raw.select(
        ts.dt.replace_time_zone("UTC").alias("arrived_at"),
        pl.col("ContextTokens").alias("input_tokens"),
        pl.col("GeneratedTokens").alias("output_tokens"),
    )


def load_azure(kind: str) -> pl.DataFrame:
    """Azure LLM inference trace 2023, ``kind`` "code" or "conv", in file (time) order.

    Returns
    -------
    pl.DataFrame
        arrived_at (Datetime us UTC; the trace's zone is unstated, read as UTC), input_tokens (i32),
        output_tokens (i32).
    """
    if kind not in AZURE_KINDS:
        raise ValueError(f"unknown Azure trace {kind!r}; known: {AZURE_KINDS}")
    return _azure(data_dir(), kind).clone()


@lru_cache(maxsize=2)
def _mooncake(root: Path) -> pl.DataFrame:
    path = root / "traces" / "mooncake_fast25" / "conversation_trace.jsonl.gz"
    schema = {
        "timestamp": pl.Int64,
        "input_length": pl.Int32,
        "output_length": pl.Int32,
        "hash_ids": pl.List(pl.Int64),
    }
    raw = pl.read_ndjson(path, schema=schema)
    return raw.select(
        pl.col("timestamp").alias("arrival_ms"),
        pl.col("input_length").alias("input_tokens"),
        pl.col("output_length").alias("output_tokens"),
        pl.col("hash_ids").alias("prefix_block_ids"),
    )


def load_mooncake() -> pl.DataFrame:
    """Mooncake FAST'25 conversation trace, in file (time) order.

    Returns
    -------
    pl.DataFrame
        arrival_ms (i64, ms from the trace start), input_tokens (i32), output_tokens (i32),
        prefix_block_ids (list[i64], 512-token prefix-block hashes, as published).
    """
    return _mooncake(data_dir()).clone()
