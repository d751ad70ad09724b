"""The worker's link to Kafka: its input consumer per connection, broker-fault detection and their policies.

Policies (docs/streaming.md, "Broker faults"):

- Stored position beyond a partition's end (the topic was deleted and recreated, or an in-memory broker
  restarted): the partition resumes from its earliest available offset, the stored position is lowered to
  just before it (so those records are ingested, not skipped as already seen), and the gap is reported: one
  ERROR line (topic, partition, stored offset, end offset, earliest offset), `counts.offset_gaps` in the
  stats line (persisted with the counters) and `kafka.last_offset_gap`. Because Tansu under-reports a
  partition's end (the start of its last record batch + 1, BROKER.md), a position past the reported end
  is confirmed by fetching the stored offset itself before anything is reset; a position is never reset on
  an unconfirmed or failed check. A partition idle at a position past the reported end is checked again
  every `offset_recheck_s` (a topic recreated while the worker runs; Apache Kafka also answers such a fetch
  with "offset out of range", which triggers the same check at once).
- Stored position before the earliest available offset (retention deleted records the worker never read):
  resume from the earliest, report the gap the same way (the lost records cannot be recovered).
- Outage: a watcher asks the broker for metadata every `broker_probe_interval_s`; two failures in a row
  close the consumer, and reconnecting is retried with exponential backoff (0.5 s doubling to
  `reconnect_backoff_max_s`), one WARNING line per attempt, `kafka.state` in the stats line. On reconnect
  the missing topics are created again and the group is rejoined, which re-runs the position checks.
- aiokafka's own repeated error lines (one per retry, ~100 a second during an outage) are let through once
  per message per 30 s (`RepeatFilter`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError, OffsetOutOfRangeError
from aiokafka.structs import TopicPartition
from faust.auth import SASLCredentials, SSLCredentials

from schemas.kafka_client import KafkaClientSettings, client_kwargs, close_client, quiet_aiokafka, ssl_context
from schemas.topics import Topics, ensure_topics
from streams.settings import WorkerSettings

log = logging.getLogger("aurelius.worker")

#: Longest wait for the fetch that confirms a stored offset still exists (s).
CONFIRM_S = 3.0
#: Longest wait for a whole position check; a check that times out changes nothing (s).
CHECK_TIMEOUT_S = 10.0

T = TypeVar("T")


def faust_credentials(kafka: KafkaClientSettings) -> Any:
    """The faust `broker_credentials` equal to `client_kwargs(kafka, ...)` (None for PLAINTEXT).

    faust builds its own aiokafka producer and consumer from these (`credentials_to_aiokafka_auth`), so the
    worker's producer gets the same protocol, mechanism, user, password and TLS context as every other client.
    """
    if kafka.security_protocol == "PLAINTEXT":
        return None

    if not kafka.uses_sasl:
        return SSLCredentials(ssl_context(kafka))
    assert kafka.sasl_password is not None
    return SASLCredentials(username=kafka.sasl_username, password=kafka.sasl_password.get_secret_value(),
                           mechanism=kafka.sasl_mechanism, ssl_context=ssl_context(kafka) if kafka.uses_tls else None)


class RepeatFilter(logging.Filter):
    """Let a record through once per (logger, message template) per `window_s`; the next one let through
    says how many were held back. Nothing else changes (levels, handlers, format)."""

    def __init__(self, window_s: float = 30.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._seen: dict[tuple[str, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        held = int(seen[1]) if seen is not None else 0
        self._seen[key] = [now, 0]
        if held:
            record.msg = f"{record.msg} [{held} alike held back in {self.window_s:.0f} s]"
        return True


_REPEATS = RepeatFilter()


def install_repeat_filter() -> None:
    """Put the shared `RepeatFilter` on every aiokafka logger that exists (idempotent)."""
    names = [n for n in list(logging.root.manager.loggerDict) if n == "aiokafka" or n.startswith("aiokafka.")]
    for name in names:
        lg = logging.getLogger(name)
        if _REPEATS not in lg.filters:
            lg.addFilter(_REPEATS)


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def short_reason(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its text."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()
    if not text:
        return name
    return text[0] if text[0].startswith(name) else f"{name}: {text[0]}"


@dataclass(frozen=True)
class OffsetGap:
    """A stored position the partition no longer has.

    kind : "beyond_end" (the stored offset is past the partition's end: topic recreated, broker reset) or
        "before_start" (retention deleted offsets after it that the worker never read).
    stored : last offset the worker ingested (the stored position).
    end : the partition's end offset as the broker reported it.
    earliest : its earliest available offset, where consumption resumes.
    """

    topic: str
    partition: int
    kind: str
    stored: int
    end: int
    earliest: int

    def message(self, total: int) -> str:
        """The ERROR line."""
        if self.kind == "beyond_end":
            why = (f"stored offset {self.stored} is beyond the partition's end offset {self.end} (confirmed by "
                   "fetch): the topic was recreated or the broker lost its log; records the old log held after "
                   f"offset {self.stored} were never ingested")
        else:
            why = (f"stored offset {self.stored} precedes the earliest available offset {self.earliest} (end "
                   f"offset {self.end}): retention deleted {self.earliest - self.stored - 1} records before "
                   "the worker read them")
        return (f"OFFSET GAP topic={self.topic} partition={self.partition} stored_offset={self.stored} "
                f"end_offset={self.end}: {why}; resuming from the earliest available offset {self.earliest} "
                f"(offset_gaps={total})")


@dataclass
class BrokerLink:
    """The worker's connection state, reported in the stats line as `kafka` (see `snapshot`).

    state : "connecting" (before the first connection), "connected" or "unreachable".
    outages : times the broker became unreachable (count).
    attempts : failed reconnect attempts in the current outage (count).
    """

    bootstrap_servers: str
    state: str = "connecting"
    since: float = field(default_factory=time.monotonic)
    since_utc: str = field(default_factory=_utc_now)
    outages: int = 0
    attempts: int = 0
    last_error: str | None = None
    last_offset_gap: dict[str, Any] | None = None

    def _enter(self, state: str) -> None:
        self.state, self.since, self.since_utc = state, time.monotonic(), _utc_now()

    def connected(self) -> None:
        """A connection (consumer started, group joined) succeeded."""
        if self.state == "unreachable":
            log.warning("kafka: broker %s reachable again after %.1f s (%d failed attempts); resuming from the "
                        "stored positions", self.bootstrap_servers, time.monotonic() - self.since, self.attempts)
        if self.state != "connected":
            self._enter("connected")
        self.attempts = 0

    def unreachable(self, reason: str) -> None:
        """The broker stopped answering (or the first connection failed)."""
        self.last_error = reason
        if self.state != "unreachable":
            self.outages += 1
            self._enter("unreachable")
            log.warning("kafka: broker %s unreachable (%s); consumption paused, reconnecting with backoff",
                        self.bootstrap_servers, reason)

    def failed_attempt(self, reason: str, next_in_s: float) -> None:
        """One reconnect attempt failed; the next comes in `next_in_s` (s)."""
        self.attempts += 1
        self.last_error = reason
        log.warning("kafka: broker %s still unreachable after %.1f s (attempt %d: %s); next attempt in %.1f s",
                    self.bootstrap_servers, time.monotonic() - self.since, self.attempts, reason, next_in_s)

    def snapshot(self) -> dict[str, Any]:
        """The `kafka` object of the stats line."""
        return {"state": self.state, "since": self.since_utc, "for_s": round(time.monotonic() - self.since, 1),
                "outages": self.outages, "attempts": self.attempts, "last_error": self.last_error,
                "last_offset_gap": self.last_offset_gap}


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
        return True
    except TimeoutError:
        return False


async def connect_with_backoff(open_: Callable[[], Awaitable[T]], link: BrokerLink, stop: asyncio.Event,
                               backoff_max_s: float, first_delay_s: float = 0.5) -> T | None:
    """`await open_()` until it succeeds, waiting 0.5 s, 1 s, 2 s, ... up to `backoff_max_s` between attempts.

    Returns what `open_` returned, or None once `stop` is set. Every failure is one WARNING line (`link`).
    """
    delay = first_delay_s
    while not stop.is_set():
        try:
            with quiet_aiokafka():
                opened = await open_()
        except Exception as exc:
            reason = short_reason(exc)
            link.unreachable(reason)
            link.failed_attempt(reason, delay)
            if await _stopped_within(stop, delay):
                return None
            delay = min(2 * delay, backoff_max_s)
            continue
        link.connected()
        return opened
    return None


#: Publish errors that retrying cannot mend (the record or the permissions are wrong, not the connection).
_FATAL_SEND = ("MessageSizeTooLargeError", "RecordTooLargeError", "RecordListTooLargeError", "InvalidTopicError",
               "TopicAuthorizationFailedError", "ClusterAuthorizationFailedError", "UnsupportedVersionError",
               "KafkaConfigurationError", "IllegalArgumentError")


async def publish_with_retry(send_once: Callable[[], Awaitable[None]], what: str, backoff_max_s: float) -> None:
    """`await send_once()` until the broker acknowledges, retrying transient failures (broker down, topic
    missing after a broker reset, timeouts) with backoff 0.5 s doubling to `backoff_max_s`; one WARNING line
    per failure. Re-sending is safe: audit records and dead letters are keyed and the sinks are idempotent.
    """

    delay, failures, t0 = 0.5, 0, time.monotonic()
    while True:
        try:
            await send_once()
        except (KafkaError, OSError, TimeoutError) as exc:
            if type(exc).__name__ in _FATAL_SEND:
                raise
            failures += 1
            log.warning("kafka: %s failed (%s); retry %d in %.1f s", what, short_reason(exc), failures, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, backoff_max_s)
            continue
        if failures:
            log.warning("kafka: %s done after %d retries (%.1f s)", what, failures, time.monotonic() - t0)
        return


class PositionGuard:
    """Checks stored positions against the partitions' offsets through a group-less probe consumer."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe

    async def check(self, stored: Mapping[Any, int]) -> dict[Any, OffsetGap]:
        """The gaps among `stored` (TopicPartition -> last ingested offset); partitions without one are absent.

        A position past the reported end counts as a gap only when fetching the stored offset itself finds
        nothing (Tansu reports the start of the last batch + 1 as the end, so the reported end alone would
        reset positions that are fine).
        """
        if not stored:
            return {}
        tps = list(stored)
        earliest = await self.probe.beginning_offsets(tps)
        end = await self.probe.end_offsets(tps)
        gaps: dict[Any, OffsetGap] = {}
        past_end: dict[Any, int] = {}
        for tp, pos in stored.items():
            if pos + 1 < earliest[tp]:
                gaps[tp] = OffsetGap(tp.topic, tp.partition, "before_start", pos, end[tp], earliest[tp])
            elif pos + 1 > end[tp]:
                past_end[tp] = pos
        if past_end:
            present = await self._present(past_end)
            for tp, pos in past_end.items():
                if tp in present:
                    log.info("kafka: %s[%d] reports end offset %d, but stored offset %d exists (under-reported "
                             "end); resuming after it", tp.topic, tp.partition, end[tp], pos)
                else:
                    gaps[tp] = OffsetGap(tp.topic, tp.partition, "beyond_end", pos, end[tp], earliest[tp])
        return gaps

    async def _present(self, offsets: Mapping[Any, int]) -> set[Any]:
        """The partitions among `offsets` where a record at or after the given offset can be fetched."""

        want = dict(offsets)
        found: set[Any] = set()
        deadline = time.monotonic() + CONFIRM_S
        try:
            self.probe.assign(list(want))
            for tp, off in want.items():
                self.probe.seek(tp, off)
            while want and time.monotonic() < deadline:
                try:
                    got = await self.probe.getmany(*want, timeout_ms=200)
                except OffsetOutOfRangeError as exc:  # Apache Kafka: the offset is not in the log
                    gone = set(exc.args[0]) if exc.args and isinstance(exc.args[0], dict) else set()
                    for tp in gone:
                        want.pop(tp, None)
                    self.probe.assign(list(want))
                    for tp, off in want.items():
                        self.probe.seek(tp, off)
                    continue
                for tp, msgs in got.items():
                    if tp in want and any(m.offset >= want[tp] for m in msgs):
                        found.add(tp)
                        del want[tp]
        finally:
            self.probe.unsubscribe()
        return found


class InputConsumer:
    """The worker's consumer of the input topics for one connection (a new one after each outage).

    The consumer joins group `group_id` with `auto_offset_reset="none"`, so the broker's "offset out of range"
    is never silently turned into a reset: on every assignment each partition is placed at its stored position
    (checked by `PositionGuard` before it fetches), at its committed offset without one, else at its beginning.

    Parameters
    ----------
    settings : worker settings (broker, security, group, timers, batch sizes, probe interval).
    topics : the deployment's topics.
    worker : the batch driver (`streams.app.Worker`): its pipeline state holds the stored positions and counters.
    link : the connection state the stats line reports.
    """

    def __init__(self, settings: WorkerSettings, topics: Topics, worker: Any, link: BrokerLink) -> None:
        self.settings, self.topics, self.worker, self.link = settings, topics, worker, link
        self.consumer: Any = None
        self.guard: PositionGuard | None = None
        self.seen: dict[tuple[str, int], int] = {}
        self.checked_at: dict[Any, float] = {}
        self.unchecked: set[Any] = set()
        self.lost: str | None = None
        self._watch_task: asyncio.Task[None] | None = None

    async def open(self) -> InputConsumer:
        """Start the probe, create missing topics, start the consumer (joins the group), start the watcher."""

        s = self.settings
        kw = client_kwargs(s.kafka, s.bootstrap_servers)
        timeout = max(10.0, 2 * s.rebalance_timeout_s)
        session = self

        class PlaceAtStored(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await session.worker.drain()

            async def on_partitions_assigned(self, assigned: Any) -> None:
                session.assigned(assigned)

        try:
            probe = AIOKafkaConsumer(**kw, enable_auto_commit=False, auto_offset_reset="none", fetch_max_wait_ms=100)
            self.guard = PositionGuard(probe)
            await asyncio.wait_for(probe.start(), timeout)
            await ensure_topics(s.bootstrap_servers, self.topics.all(), kafka=s.kafka)
            self.consumer = AIOKafkaConsumer(
                **kw, group_id=s.group_id, enable_auto_commit=False, auto_offset_reset="none",
                session_timeout_ms=int(s.session_timeout_s * 1000),
                heartbeat_interval_ms=int(s.heartbeat_interval_s * 1000),
                rebalance_timeout_ms=int(s.rebalance_timeout_s * 1000),
                max_poll_records=s.batch_max_records, max_partition_fetch_bytes=16 * 1024 * 1024,
                fetch_max_bytes=64 * 1024 * 1024,
            )
            self.consumer.subscribe([t.name for t in self.topics.inputs()], listener=PlaceAtStored())
            await asyncio.wait_for(self.consumer.start(), timeout)
        except BaseException:
            await self.close()
            raise
        self._watch_task = asyncio.create_task(self._watch())
        return self

    async def close(self) -> None:
        """Stop the watcher, the consumer and the probe (bounded: the broker may be gone)."""
        if self._watch_task is not None:
            self._watch_task.cancel()
        for client in (self.consumer, self.guard.probe if self.guard else None):
            if client is not None:
                await close_client(client)

    # --- positions -----------------------------------------------------------------------------------------

    def _stored(self, tps: Any) -> dict[Any, int]:
        positions = self.worker.pipeline.state.positions
        return {tp: positions[(tp.topic, tp.partition)] for tp in tps if (tp.topic, tp.partition) in positions}

    async def _gaps(self, stored: Mapping[Any, int]) -> dict[Any, OffsetGap]:
        assert self.guard is not None
        try:
            return await asyncio.wait_for(self.guard.check(stored), CHECK_TIMEOUT_S)
        except Exception as exc:  # never reset on a check that did not complete (broker gone, timeout)
            log.warning("kafka: could not check stored positions against the broker (%s); keeping them",
                        short_reason(exc))
            return {}

    def assigned(self, assigned: Any) -> None:
        """Rebalance callback (no I/O: awaiting the broker inside it can stall the join): seek each partition
        with a stored position to it + 1 and pause it until `settle` has checked it. Partitions without one
        start at their committed offset, else (NoOffsetForPartitionError in the poll loop) the beginning."""
        stored = self._stored(assigned)
        for tp, pos in stored.items():
            self.consumer.seek(tp, pos + 1)
        if stored:
            self.consumer.pause(*stored)
            self.unchecked.update(stored)

    async def settle(self) -> None:
        """Check the partitions placed by the last assignment against the broker, apply the gap policy, and
        let them fetch (called by the poll loop before every poll; nothing to do most of the time)."""
        if not self.unchecked:
            return
        tps = [tp for tp in self.unchecked if tp in self.consumer.assignment()]
        self.unchecked.clear()
        gaps = await self._gaps(self._stored(tps))
        now = time.monotonic()
        for tp in tps:
            self.checked_at[tp] = now
            if tp in gaps:
                self.resume_after_gap(gaps[tp])
        ready = [tp for tp in tps if tp in self.consumer.assignment() and tp not in self.unchecked]
        if ready:  # a rebalance during the check re-paused (and will re-check) what it assigned again
            self.consumer.resume(*ready)

    def resume_after_gap(self, gap: OffsetGap) -> None:
        """Apply the policy: count and log the gap, lower the stored position, seek to the earliest offset."""

        st = self.worker.pipeline.state
        key = (gap.topic, gap.partition)
        st.counts["offset_gaps"] = st.counts.get("offset_gaps", 0) + 1
        if gap.kind == "beyond_end":
            st.positions[key] = gap.earliest - 1  # the new log's records are not "already ingested"
        self.seen.pop(key, None)
        self.link.last_offset_gap = {**asdict(gap), "at": _utc_now()}
        log.error(gap.message(st.counts["offset_gaps"]))
        tp = TopicPartition(gap.topic, gap.partition)
        if tp in self.consumer.assignment():  # else the next assignment places it at the lowered position
            self.consumer.seek(tp, gap.earliest)

    async def out_of_range(self, offsets: Mapping[Any, int]) -> None:
        """The broker said fetch offsets are out of range (Apache Kafka; Tansu returns nothing instead)."""
        await self.worker.drain()
        stored = self._stored(offsets)
        gaps = await self._gaps(stored)
        for tp in offsets:
            if tp in gaps:
                self.resume_after_gap(gaps[tp])
            elif tp in stored:  # the check disagrees with the fetch: retry from the stored position, slowly
                log.warning("kafka: %s[%d] fetch offset out of range, but the stored offset %d checks out; retrying",
                            tp.topic, tp.partition, stored[tp])
                self.consumer.seek(tp, stored[tp] + 1)
                await asyncio.sleep(1.0)
            else:
                await self.consumer.seek_to_beginning(tp)

    async def idle_check(self) -> None:
        """After an empty poll: re-check partitions whose stored position is past the high-water mark the
        fetches report (at most every `offset_recheck_s` per partition), for a topic recreated while the worker
        ran."""
        if self.lost is not None:
            return
        now, every = time.monotonic(), self.settings.offset_recheck_s
        due = {}
        for tp, pos in self._stored(self.consumer.assignment()).items():
            hw = self.consumer.highwater(tp)
            if hw is not None and pos + 1 > hw and now - self.checked_at.get(tp, -every) >= every:
                due[tp] = pos
        if not due:
            return
        self.checked_at.update(dict.fromkeys(due, now))
        await self.worker.drain()
        for gap in (await self._gaps(due)).values():
            self.resume_after_gap(gap)

    # --- outage --------------------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Ask for metadata every `broker_probe_interval_s`; two failures in a row set `lost` (the poll loop then
        reconnects) and mark the link unreachable at once. While lost, keep asking with backoff (0.5 s doubling
        to `reconnect_backoff_max_s`, one WARNING line each), so the outage is retried and reported even while
        the poll loop waits on a publish. Recreate the topics a (restarted) broker no longer has, so that
        waiting publish and the next connection find them."""

        interval = self.settings.broker_probe_interval_s
        failures, wait = 0, interval
        while True:
            await asyncio.sleep(wait)
            try:
                with quiet_aiokafka():
                    names = await asyncio.wait_for(self.consumer.topics(), max(interval, 2.0))
            except (KafkaError, OSError, TimeoutError) as exc:
                failures += 1
                reason = short_reason(exc)
                if self.lost is None and failures < 2:
                    wait = min(1.0, interval)
                    continue
                if self.lost is None:
                    self.lost = reason
                    self.link.unreachable(reason)
                    wait = 0.5
                else:
                    wait = min(2 * wait, self.settings.reconnect_backoff_max_s)
                self.link.failed_attempt(reason, wait)
                continue
            failures, wait = 0, interval
            if self.lost is not None:
                self.link.connected()
            missing = sorted({t.name for t in self.topics.all()} - set(names))
            if missing:
                log.warning("kafka: topics missing on the broker (broker reset or topic deleted): %s; creating them",
                            ", ".join(missing))
                try:
                    await ensure_topics(self.settings.bootstrap_servers, self.topics.all(), kafka=self.settings.kafka)
                except Exception as exc:
                    log.warning("kafka: could not create the missing topics: %s", short_reason(exc))
