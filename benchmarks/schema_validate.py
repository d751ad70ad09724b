"""Validation throughput of the compiled wire-schema validators (records/s).

Usage: python benchmarks/schema_validate.py [--records N] [--kind KIND]

Validates N distinct records (default 100k gpu_telemetry) with ``schemas.validator`` and, separately, the
whole Kafka hot path ``schemas.decode`` (bytes -> JSON -> validate). Target: 100k telemetry records < 1 s.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

from schemas import decode, validator
from schemas.protocol import RequestClass
from schemas.records import GpuTelemetry, RequestArrival

T0 = datetime(2023, 7, 1, 13, tzinfo=UTC)


def telemetry(i: int) -> dict:
    at = T0 + timedelta(seconds=i // 64)
    return GpuTelemetry(
        at,
        at + timedelta(milliseconds=250),
        "pjm-1",
        f"node-{i % 64 // 8:02d}",
        i % 8,
        f"GPU-{i % 64:04x}",
        "NVIDIA H100 80GB HBM3",
        f"r-{i % 16}",
        "llama-3.1-70b",
        300.0 + i % 400,
        1.0e9 + i,
        1980.0,
        float(i % 101),
        70000.0,
        60.0,
        i % 50,
        i % 7,
        (i % 100) / 100,
    ).to_wire()


def arrival(i: int) -> dict:
    at = T0 + timedelta(milliseconds=i)
    return RequestArrival(
        f"req-{i}",
        at,
        at,
        RequestClass.CHAT,
        "llama-3.1-70b",
        100 + i % 4000,
        tuple(range(i % 8)),
        "pjm-1",
        "acme",
        ("us-east",),
        2000.0,
        100.0,
        None,
    ).to_wire()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--kind", choices=["gpu_telemetry", "request_arrival"], default="gpu_telemetry")
    args = parser.parse_args()
    make = telemetry if args.kind == "gpu_telemetry" else arrival
    records = [make(i) for i in range(args.records)]
    raws = [json.dumps(r).encode() for r in records]
    check = validator(args.kind)
    check(records[0])  # compile outside the timing

    t = time.perf_counter()
    for r in records:
        check(r)
    validate_s = time.perf_counter() - t
    t = time.perf_counter()
    for raw in raws:
        decode(args.kind, raw)
    decode_s = time.perf_counter() - t

    n = args.records
    print(f"{args.kind}: validate {n} records in {validate_s:.3f} s = {n / validate_s:,.0f} records/s")
    print(f"{args.kind}: decode+validate {n} records in {decode_s:.3f} s = {n / decode_s:,.0f} records/s")


if __name__ == "__main__":
    main()
