"""The worker's Prometheus metrics and its HTTP endpoint: `/metrics`, `/healthz`, `/readyz`.

`WorkerMetrics` owns its own `CollectorRegistry` (never the global one, so tests and several workers in one
process do not clash). The `Worker` (streams/app.py) updates it once per micro-batch and once per decision,
never per record (one C-level count of the batch's topics); `consume_loop` sets the consumer lag per batch
and hands it the broker link. Names follow the Prometheus conventions operators' tools assume
(CONVENTIONS.md, section 2: counters end `_total`, gauges never; the unit is the suffix, in base units).

Counters (`_total`): `aurelius_records_in_total{topic}` (consumed; re-deliveries at or below the stored
position excluded), `aurelius_records_stored_total{topic}` (accepted and committed to the world model, duplicate
keys included: in = stored + dead-lettered), `aurelius_dead_letters_total{topic,reason}` (reason: a class of
`DEAD_LETTER_REASONS`), `aurelius_late_records_total` (accepted after their period closed),
`aurelius_decisions_total` (stored in the outbox), `aurelius_fallbacks_total{reason}` (of those, the reference plan
as fallback; reason: a class of `FALLBACK_REASONS`).
Gauges: `aurelius_consumer_lag_records{topic,partition}` (high-water mark minus the next offset to fetch),
`aurelius_watermark_delay_seconds` (below), `aurelius_world_model_rows{table}` (rows of each raw world-model
table), `aurelius_decided_through_period` (last period decided into the outbox, -1: none), `aurelius_broker_up`
(1 while the broker link is connected).
Histograms: `aurelius_period_close_to_audit_seconds` (from the batch that closed a period being received to its
audit record published), `aurelius_decision_seconds` (the decider's call for one period).

Counters count from this process's start (Prometheus handles the reset at a restart); the totals kept across
restarts are the stats line's `counts`. Reasons are bounded classes, never the free text of a reason, so the
label sets stay small whatever the records hold.

Watermark delay is measured in event time, never against the wall clock (a replay of 2023 data would read
as years behind): the stream's clock (the largest clock time consumed over all input partitions) minus the
watermark that closes periods (the smallest largest clock time over the partitions with records still to
deliver, or the stream's clock when all are caught up, minus `allowed_lateness_s`; never below the end of
the last closed period). Caught up it equals `allowed_lateness_s`; it grows while a partition lags.

Health (`/healthz`): 200 when the worker's event loop runs a callback within `LOOP_PROBE_S` (before the loop
exists, the process answering is enough); 503 otherwise. Readiness (`/readyz`): 200 once the worker has
loaded its state (start-up decisions and outbox re-sends done, consumption started) and while its broker link
is connected; 503 with a one-line reason otherwise.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import attrgetter
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Gauge, Histogram, make_wsgi_app
from prometheus_client import Counter as PromCounter

from schemas.timestamps import to_us
from schemas.topics import Topics
from streams.pipeline import Inbound, Outbound
from worldmodel.state.migrations import RAW_KINDS

#: Reason classes of `aurelius_dead_letters_total` (`dead_letter_reason`), in the order they are tested.
DEAD_LETTER_REASONS = ("tombstone", "too_large", "invalid_json", "non_finite", "duplicate_key", "bad_text",
                       "int_range", "unreadable_time", "missing_field", "unknown_field", "schema", "unmappable",
                       "event_time_early", "event_time_ahead", "other")
#: Reason classes of `aurelius_fallbacks_total` (`fallback_reason`).
FALLBACK_REASONS = ("missing_inputs", "start", "low_confidence", "hard_gates", "pareto", "other")
#: Longest wait for the event loop to run a callback before `/healthz` answers 503 (s).
LOOP_PROBE_S = 2.0
#: Buckets of `aurelius_period_close_to_audit_seconds` (s; the target is p95 <= 2 s).
CLOSE_TO_AUDIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Buckets of `aurelius_decision_seconds` (s; measured p95 0.67-0.86 s on 2 shared cores).
DECISION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

# (class, substring of the reason text) for schemas.SchemaError reasons (schemas/__init__.py, streams/pipeline.py)
_SCHEMA_REASONS = (
    ("tombstone", "(tombstone)"),
    ("too_large", "over max_record_bytes"),
    ("invalid_json", "invalid JSON"),
    ("non_finite", "finite number"),
    ("non_finite", "non-finite number"),
    ("duplicate_key", "duplicate key"),
    ("bad_text", "surrogate"),
    ("int_range", "must fit the stored Int"),
    ("unreadable_time", "unreadable time"),
    ("missing_field", "missing required field"),
    ("unknown_field", "unexpected field"),
)
_FALLBACK_PREFIXES = (("missing_inputs", "missing inputs"), ("start", "start:"),
                      ("low_confidence", "forecast confidence"), ("hard_gates", "no candidate passed the hard gates"),
                      ("pareto", "pareto:"))


def dead_letter_reason(error_class: str, reason: str) -> str:
    """The bounded class (one of `DEAD_LETTER_REASONS`) of a dead letter's error class (fully qualified) and reason.

    Examples
    --------
    >>> dead_letter_reason("schemas.SchemaError", "invalid JSON: Expecting value: line 1 column 1 (char 0)")
    'invalid_json'
    >>> dead_letter_reason("streams.pipeline.EventTimeError", "field 'event_at' = 2023-07-31T12:00:00Z is more "
    ...                    "than 1 day ahead of the stream: after ...")
    'event_time_ahead'
    >>> dead_letter_reason("builtins.KeyError", "anything at all")
    'other'
    """
    name = error_class.rsplit(".", 1)[-1]
    if name == "EventTimeError":
        return "event_time_early" if " is before " in reason else "event_time_ahead"
    if name == "FieldMapError":
        return "unmappable"
    if name != "SchemaError":
        return "other"
    for cls, text in _SCHEMA_REASONS:
        if text in reason:
            return cls
    return "schema"


def fallback_reason(reason: str | None) -> str:
    """The bounded class (one of `FALLBACK_REASONS`) of an audit record's `fallback_reason`.

    Examples
    --------
    >>> fallback_reason("missing inputs: no price has arrived for CAISO")
    'missing_inputs'
    >>> fallback_reason("pareto: predicted gp/$ gain 0.4% < 3%")
    'pareto'
    """
    text = (reason or "").strip()
    return next((cls for cls, prefix in _FALLBACK_PREFIXES if text.startswith(prefix)), "other")


class WorkerMetrics:
    """The worker's metrics in their own registry (module doc: names, labels, meaning).

    Parameters
    ----------
    topics : the deployment's topics; the per-topic series of the input topics start at 0. None: no series
        until records come.
    rows_interval_s : least time between two counts of the world-model tables (s; 0: after every batch).
    """

    def __init__(self, topics: Topics | None = None, rows_interval_s: float = 5.0) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.records_in = PromCounter("aurelius_records_in_total", "Records consumed from the input topics "
                                      "(re-deliveries below the stored position excluded).", ["topic"], registry=r)
        self.records_stored = PromCounter("aurelius_records_stored_total", "Records accepted and committed to the "
                                          "world model (duplicate keys included).", ["topic"], registry=r)
        self.dead_letters = PromCounter("aurelius_dead_letters_total", "Records dead-lettered, by bounded reason "
                                        "class.", ["topic", "reason"], registry=r)
        self.late_records = PromCounter("aurelius_late_records_total", "Accepted records whose period had already "
                                        "closed.", registry=r)
        self.decisions = PromCounter("aurelius_decisions_total", "Decisions made (stored in the outbox).",
                                     registry=r)
        self.fallbacks = PromCounter("aurelius_fallbacks_total", "Decisions that recommend the reference plan as "
                                     "fallback, by bounded reason class.", ["reason"], registry=r)
        self.consumer_lag = Gauge("aurelius_consumer_lag_records", "High-water mark minus the next offset to fetch "
                                  "(records).", ["topic", "partition"], registry=r)
        self.watermark_delay = Gauge("aurelius_watermark_delay_seconds", "The stream's clock (largest clock time "
                                     "consumed) minus the watermark that closes periods, in event time (s).",
                                     registry=r)
        self.world_model_rows = Gauge("aurelius_world_model_rows", "Rows of each raw world-model table.", ["table"],
                                      registry=r)
        self.decided_through = Gauge("aurelius_decided_through_period", "Last period whose decision is in the "
                                     "outbox (-1: none).", registry=r)
        self.broker_up = Gauge("aurelius_broker_up", "1 while the broker link is connected, else 0.", registry=r)
        self.close_to_audit = Histogram("aurelius_period_close_to_audit_seconds", "From the batch that closed a "
                                        "period being received to its audit record published (s).",
                                        buckets=CLOSE_TO_AUDIT_BUCKETS, registry=r)
        self.decision_seconds = Histogram("aurelius_decision_seconds", "The decider's call for one period (s).",
                                          buckets=DECISION_BUCKETS, registry=r)
        for t in topics.inputs() if topics is not None else ():
            self.records_in.labels(t.name)
            self.records_stored.labels(t.name)
        for cls in FALLBACK_REASONS:
            self.fallbacks.labels(cls)
        self.decided_through.set(-1)
        self.rows_interval_s = rows_interval_s
        self.worker: Any = None
        self.link: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._late = 0
        self._skipped = 0
        self._watermark_us: int | None = None
        self._lag_keys: set[tuple[str, int]] = set()
        self._rows_at = -float("inf")
        self.broker_up.set_function(lambda: float(self.link is not None and self.link.state == "connected"))

    # --- updates -------------------------------------------------------------------------------------------

    def attach(self, worker: Any) -> None:
        """Bind the `Worker` (its state is loaded): baselines of the state's counters, decided-through, rows."""
        self.worker = worker
        counts = worker.pipeline.state.counts
        self._late, self._skipped = counts.get("late", 0), counts.get("skipped_redelivered", 0)
        self.decided_through.set_function(lambda: float(worker.pipeline.state.decided_through))
        self.count_rows(worker.ingestor)

    def started(self, link: Any) -> None:
        """The worker has loaded its state and consumes through `link` (streams.kafka_link.BrokerLink), on the
        running event loop: from now on readiness follows the link."""
        self.link = link
        self.loop = asyncio.get_running_loop()

    def consumed(self, records: Sequence[Inbound], dead_letters: Sequence[Outbound],
                 before: Mapping[tuple[str, int], int] | None,
                 active: Collection[tuple[str, int]] | None) -> Counter[str]:
        """Account one validated micro-batch (its dead letters published); return the records it accepted per
        topic, for `committed` once they are stored.

        Parameters
        ----------
        records : the batch as consumed.
        dead_letters : its dead letters (`streams.pipeline.dead_letter`: Spring headers name topic and reason).
        before : the stored positions before the batch (re-deliveries at or below them are not counted in).
        active : partitions with records still to deliver (the watermark waits for them); None: none.
        """
        counts = self.worker.pipeline.state.counts
        skipped, self._skipped = counts["skipped_redelivered"] - self._skipped, counts["skipped_redelivered"]
        if skipped and before is not None:
            got = Counter(m.topic for m in records if m.offset > before.get((m.topic, m.partition), -1))
        else:
            got = Counter(map(attrgetter("topic"), records))
        accepted = Counter(got)
        for o in dead_letters:
            h = dict(o.headers)
            topic = h.get("kafka_dlt-original-topic", b"").decode()
            reason = dead_letter_reason(h.get("kafka_dlt-exception-fqcn", b"").decode(),
                                        h.get("kafka_dlt-exception-message", b"").decode(errors="replace"))
            self.dead_letters.labels(topic, reason).inc()
            accepted[topic] -= 1
        for topic, n in got.items():
            self.records_in.labels(topic).inc(n)
        late, self._late = counts["late"] - self._late, counts["late"]
        if late > 0:
            self.late_records.inc(late)
        self._set_watermark_delay(active)
        return accepted

    def _set_watermark_delay(self, active: Collection[tuple[str, int]] | None) -> None:
        clock = self.worker.pipeline.clock
        if clock.max_event_at is None or clock.origin is None:
            return
        top = to_us(clock.max_event_at)
        lags = [clock.partition_max_us.get(tp) for tp in active or ()]
        floor = to_us(clock.start_of(clock.closed_through + 1)) if clock.closed_through >= 0 else to_us(clock.origin)
        marks = [floor] if self._watermark_us is None else [floor, self._watermark_us]
        if all(v is not None for v in lags):  # an active partition without any record holds the watermark
            marks.append(min([top, *(v for v in lags if v is not None)]) - round(clock.allowed_lateness_s * 1e6))
        self._watermark_us = max(marks)
        self.watermark_delay.set(max(0, top - self._watermark_us) / 1e6)

    async def committed(self, accepted: Mapping[str, int] | None, close_to_audit_s: float, decisions: int) -> None:
        """After a batch's commit and its decisions: count its stored records, observe the close -> audit latency
        once per decision, and count the world-model tables when `rows_interval_s` has passed (in a thread,
        between the batch's DuckDB work and the next one's)."""
        for topic, n in (accepted or {}).items():
            if n > 0:
                self.records_stored.labels(topic).inc(n)
        for _ in range(decisions):
            self.close_to_audit.observe(close_to_audit_s)
        if time.monotonic() - self._rows_at >= self.rows_interval_s:
            await asyncio.to_thread(self.count_rows, self.worker.ingestor)

    def count_rows(self, ingestor: Any) -> None:
        """Set `aurelius_world_model_rows` from the raw tables of the ingestor's world state (its `world`)."""
        world = getattr(ingestor, "world", None)
        if world is None:
            return
        self._rows_at = time.monotonic()
        for raw in RAW_KINDS.values():
            self.world_model_rows.labels(raw.table).set(world.count(raw.table))

    def decided(self, record: Mapping[str, Any], seconds: float) -> None:
        """One decision stored: count it (and its fallback class), observe the decider's time `seconds` (s)."""
        self.decisions.inc()
        self.decision_seconds.observe(seconds)
        if record.get("fallback"):
            self.fallbacks.labels(fallback_reason(record.get("fallback_reason"))).inc()

    def lag(self, highwater: Mapping[tuple[str, int], int | None], positions: Mapping[tuple[str, int], int],
            seen: Mapping[tuple[str, int], int]) -> None:
        """Set the consumer lag of the assigned partitions (`highwater`; None where the consumer does not know
        it yet): high-water mark minus the next offset to fetch (the last stored or fetched + 1), at least 0
        (Tansu under-reports the high-water mark); partitions no longer assigned lose their series."""
        keys = set()
        for key, hw in highwater.items():
            if hw is None:
                continue
            keys.add(key)
            done = max(positions.get(key, -1), seen.get(key, -1)) + 1
            self.consumer_lag.labels(key[0], str(key[1])).set(max(0, hw - done))
        for key in self._lag_keys - keys:
            self.consumer_lag.remove(key[0], str(key[1]))
        self._lag_keys = keys

    # --- health --------------------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """(alive, one line): the event loop runs a callback within `LOOP_PROBE_S` (safe from any thread)."""
        loop = self.loop
        if loop is None:
            return True, "ok: process up (event loop not attached yet)"
        if loop.is_closed():
            return False, "event loop closed"
        ran = threading.Event()
        try:
            loop.call_soon_threadsafe(ran.set)
        except RuntimeError:  # closed between the check and the call
            return False, "event loop closed"
        if not ran.wait(LOOP_PROBE_S):
            return False, f"event loop did not run a callback within {LOOP_PROBE_S:.0f} s (blocked or stopped)"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """(ready, one line): ready once the state is loaded and consumption started, while the link is up."""
        link = self.link
        if self.worker is None or link is None:
            return False, "not ready: worker starting (state not loaded, consumption not started)"
        if link.state != "connected":
            why = f" ({link.last_error})" if link.last_error else ""
            return False, f"not ready: broker {link.state} for {time.monotonic() - link.since:.1f} s{why}"
        return True, "ready"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _wsgi(metrics: WorkerMetrics) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    export = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return export(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            ok, line = metrics.health()
        elif path == "/readyz":
            ok, line = metrics.readiness()
        else:
            ok, line = False, "not found: /metrics, /healthz, /readyz"
        status = "200 OK" if ok else "404 Not Found" if line.startswith("not found") else "503 Service Unavailable"
        body = (line + "\n").encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class MetricsServer:
    """`/metrics`, `/healthz` and `/readyz` of one `WorkerMetrics`, served by a daemon thread (one thread per
    request, so a blocked event loop never blocks a scrape).

    Parameters
    ----------
    metrics : what to serve.
    addr : address to bind (default loopback only).
    port : port to bind; 0 takes a free one (`port` says which).
    """

    def __init__(self, metrics: WorkerMetrics, addr: str = "127.0.0.1", port: int = 9464) -> None:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("_Server", (ThreadingMixIn, WSGIServer), {"daemon_threads": True,
                                                                    "address_family": family})
        self.httpd = make_server(addr, port, _wsgi(metrics), server_class, _Quiet)
        self.port: int = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="aurelius-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5.0)
