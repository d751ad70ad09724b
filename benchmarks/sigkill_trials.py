"""SIGKILL trials of the worker's crash consistency (issue 18): one audit row per decision, the same plans.

Each trial runs the Kafka worker's `Worker` (validation, DuckDB commit, decisions through the outbox, the
Parquet audit log, and a file standing in for the audit topic) in a child process, SIGKILLs it right after its
k-th progress line (k seeded, drawn over an uninterrupted run's lines; where it dies in the work that follows
is the race), restarts it to completion, and compares with the uninterrupted run: every decision id exactly once
in the Parquet log, with the uninterrupted run's plan, and every id on the "topic" (a duplicate allowed there).
The decider is deterministic in the records its period holds, so a decision re-made after a crash equals the
first. Prints a table (the phase the child was in: `batch` = ingesting a batch or making its decisions,
`published` = right after publishing a decision; rows; duplicates on the topic) and exits 1 on any lost,
duplicated or differing row.

    python benchmarks/sigkill_trials.py --trials 20            # the full run (minutes)
    python benchmarks/sigkill_trials.py --trials 2 --json OUT  # what tests/streams/test_sigkill.py runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from schemas.timestamps import ts_to_wire
from schemas.topics import Topics
from sinks.audit_store import ParquetAuditStore
from streams.app import Worker
from streams.decide import DecisionInput
from streams.ingest import DuckDBIngestor
from streams.pipeline import Inbound, Outbound, Pipeline

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2023, 7, 1, 12, tzinfo=UTC)
PERIOD_S = 60.0


class ObservedDecider:
    """A deterministic decision of what the period's records hold (a re-made decision must equal the first)."""

    def decide(self, inp: DecisionInput) -> dict:
        arrivals = inp.observations.get("request_arrival")
        n = 0 if arrivals is None else arrivals.height
        tokens = 0 if arrivals is None else int(arrivals["input_tokens"].sum())
        return {"decision_id": f"d{inp.period_index:04d}", "schema_version": "1", "policy": "sigkill",
                "markets": ["PJM"], "period_index": inp.period_index, "period_start": ts_to_wire(inp.period_start),
                "as_of": ts_to_wire(inp.period_start), "chosen_plan": {"replicas": 1 + n // 10, "tokens": tokens},
                "fallback": False, "late_records": inp.late_records}


def inputs(n: int, periods: int) -> list[bytes]:
    """`n` arrivals spread over `periods` periods (event order), sizes varying with the index."""
    out = []
    for i in range(n):
        at = ts_to_wire(T0 + timedelta(seconds=PERIOD_S * periods * i / n))
        out.append(json.dumps({
            "schema_version": "1", "request_id": f"r{i}", "event_at": at, "arrived_at": at, "request_class": "chat",
            "model": "llama-3.1-70b", "input_tokens": 100 + (i * 37) % 900, "prefix_block_ids": [],
            "site": "pjm", "tenant": "t", "allowed_regions": ["us-east"], "sla_ttft_ms": 2000.0,
            "sla_tpot_ms": 100.0, "deadline_at": None}).encode())
    return out


def main(directory: str, n: int, periods: int) -> None:
    d = Path(directory)
    topics = Topics(prefix="k.")
    ingestor = DuckDBIngestor.open(d / "state.duckdb")
    pipeline = Pipeline(topics, ingestor.load_state(), PERIOD_S, 0.0, T0)
    audit = ParquetAuditStore(d / "audit")
    topic_file = open(d / "topic.jsonl", "ab")

    async def send(o: Outbound) -> None:
        if o.topic == topics.recommendations.name:
            topic_file.write(o.value + b"\n")
            topic_file.flush()  # in the kernel's cache: it survives a SIGKILL of this process
            print("published", json.loads(o.value)["decision_id"], flush=True)

    worker = Worker(pipeline, ingestor, lambda origin: ObservedDecider(), audit, send)
    name = topics.for_kind("request_arrival").name
    records = [Inbound(name, 0, i, v) for i, v in enumerate(inputs(n, periods))]

    async def run() -> None:
        for i in range(0, len(records), 97):
            print("batch", i, flush=True)
            await worker.handle(records[i:i + 97])
        # a last record past the window closes the final periods
        end = ts_to_wire(T0 + timedelta(seconds=PERIOD_S * (periods + 2)))
        tail = json.loads(inputs(1, 1)[0])
        tail.update(request_id="tail", event_at=end, arrived_at=end)
        await worker.handle([Inbound(name, 0, len(records), json.dumps(tail).encode())])

    asyncio.run(run())
    ingestor.close()
    print("done", flush=True)


def audit_rows(d: Path) -> list[dict]:
    """Every row of the Parquet audit log, duplicates included (read the files, not the deduplicating view)."""
    import pyarrow.parquet as pq

    return [r for f in sorted((d / "audit").glob("audit-*.parquet")) for r in pq.read_table(f).to_pylist()]


def run_child(d: Path, n: int, periods: int, kill_at_line: int | None) -> list[str]:
    """Run one child to completion, or SIGKILL it as soon as it has printed `kill_at_line` progress lines (the
    child runs on for a moment between its print and the signal: where exactly it dies is the race); return
    the progress lines read."""
    p = subprocess.Popen([sys.executable, __file__, "--child", str(d), str(n), str(periods)],
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines: list[str] = []
    for line in p.stdout:  # type: ignore[union-attr]
        lines.append(line.strip())
        if kill_at_line is not None and len(lines) >= kill_at_line:
            p.send_signal(signal.SIGKILL)
            break
    code = p.wait()
    if kill_at_line is None and code != 0:
        raise RuntimeError(f"child failed: {lines[-1:]}")
    return lines


def phase(line: str) -> str:
    """The phase a progress line starts: a batch's ingestion and its decisions, after a publication, done."""
    return {"started": "start-up", "batch": "batch", "published": "published", "done": "finished"}.get(
        line.split(" ")[0], line)


def trials(k: int, n: int, periods: int, seed: int, work: Path) -> dict:
    """`k` kill-and-restart trials against one uninterrupted reference run."""
    ref_dir = work / "reference"
    ref_dir.mkdir(parents=True)
    progress = len(run_child(ref_dir, n, periods, None))
    ref = {r["decision_id"]: r["chosen_plan"] for r in audit_rows(ref_dir)}
    rng = random.Random(seed)
    out = []
    for i in range(k):
        d = work / f"trial{i}"
        d.mkdir()
        at = rng.randint(1, progress - 1)  # somewhere in the run, by its own progress
        killed_in = phase(run_child(d, n, periods, at)[-1])
        run_child(d, n, periods, None)
        rows = audit_rows(d)
        ids = [r["decision_id"] for r in rows]
        topic = [json.loads(x)["decision_id"] for x in (d / "topic.jsonl").read_bytes().splitlines()]
        out.append({"trial": i, "killed_after_line": at, "killed_in": killed_in, "rows": len(rows),
                    "lost": len(set(ref) - set(ids)), "duplicated": len(ids) - len(set(ids)),
                    "differing": sum(ref.get(r["decision_id"]) != r["chosen_plan"] for r in rows),
                    "topic_missing": len(set(ref) - set(topic)), "topic_duplicates": len(topic) - len(set(topic))})
    return {"decisions": len(ref), "progress_lines": progress, "trials": out}


def main_trials() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--records", type=int, default=1200)
    ap.add_argument("--periods", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = trials(args.trials, args.records, args.periods, args.seed, Path(tmp))
    print(f"{res['decisions']} decisions per run; {res['progress_lines']} progress lines (kills drawn among them)")
    print("trial  line  killed_in   rows  lost  dup  differing  topic_missing  topic_dup")
    for t in res["trials"]:
        print(f"{t['trial']:5d} {t['killed_after_line']:5d}  {t['killed_in']:<10} {t['rows']:5d} {t['lost']:5d} "
              f"{t['duplicated']:4d} {t['differing']:10d} {t['topic_missing']:14d} {t['topic_duplicates']:10d}")
    bad = [t for t in res["trials"] if t["lost"] or t["duplicated"] or t["differing"] or t["topic_missing"]]
    print(f"{len(res['trials'])} trials: {len(bad)} with a lost, duplicated or differing audit row")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(main_trials())
