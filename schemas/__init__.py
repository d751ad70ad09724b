"""The wire contract: one versioned JSON Schema per record kind (see schemas/README.md).

The ``*.v1.schema.json`` files are the source of truth; teams on an existing bus can validate against them
without Python. This module loads them as package data and validates with compiled (fastjsonschema)
validators, reporting every failure as a :class:`SchemaError` whose reason names the offending field.

Validation matches storage, so a record that validates can be stored: `decode` parses strictly (`parse`:
no NaN/Infinity or numbers beyond a 64-bit float, no duplicate keys, no lone UTF-16 surrogates), and the
validator of a fixed-shape kind also checks every number against the type the world model stores it as
(`schemas.records.stored_schema`: integers within Int32/Int64, floats finite).

Examples
--------
>>> try:
...     decode("price", b'{"schema_version": "1", "market": "NYISO"}')
... except SchemaError as exc:
...     print(exc.kind, exc.field)
price location
>>> try:
...     parse("price", b'{"lmp_usd_mwh": 1, "lmp_usd_mwh": NaN}')
... except SchemaError as exc:
...     print(exc.reason)
duplicate key 'lmp_usd_mwh' (values 1 and NaN): a record's keys must be unique
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any

import fastjsonschema

__all__ = ["KINDS", "SCHEMA_VERSION", "SchemaError", "decode", "load", "parse", "validate", "validator"]

SCHEMA_VERSION = "1"

#: Every record kind of the v1 wire contract, in README order.
KINDS: tuple[str, ...] = (
    "request_arrival",
    "request_completion",
    "gpu_telemetry",
    "price",
    "fleet_event",
    "audit_record",
    "dead_letter",
    "replay_result",
)


class SchemaError(ValueError):
    """A record that does not satisfy its kind's schema.

    Parameters
    ----------
    kind : record kind (one of ``KINDS``, or a field-map source name).
    reason : human-readable reason, naming the offending field.
    field : dotted path of the offending field, or None when the record as a whole is at fault.
    """

    def __init__(self, kind: str, reason: str, field: str | None = None) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.field = field


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise KeyError(f"unknown record kind {kind!r}; known: {', '.join(KINDS)}")


@cache
def _load_text(kind: str) -> str:
    _check_kind(kind)
    return files(__name__).joinpath(f"{kind}.v{SCHEMA_VERSION}.schema.json").read_text(encoding="utf-8")


def load(kind: str) -> dict[str, Any]:
    """Return a fresh copy of the JSON Schema of ``kind`` (a dict; mutating it changes nothing here)."""
    return json.loads(_load_text(kind))


def _quote(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to about `limit` characters (a reason must stay small whatever the record holds)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"<int of {int(value).bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return _cut(text, limit)


# --- strict JSON: what Python's json accepts but the store cannot keep -------------------------------------


class _NonFinite:
    """Stand-in for a number the store cannot keep (NaN, Infinity, or beyond a 64-bit float)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Refused(Exception):
    def __init__(self, reason: str, field: str | None) -> None:
        super().__init__(reason)
        self.reason, self.field = reason, field


def _float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _check_value(name: str, value: object) -> None:
    if type(value) is _NonFinite:
        why = "not JSON" if value.text in ("NaN", "Infinity", "-Infinity") else "beyond a 64-bit float"
        raise _Refused(f"field {name!r} must be a finite number (got {short_repr(value)}, {why})", name)
    if type(value) is str and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused(f"field {name!r} holds a lone UTF-16 surrogate escape (not Unicode text)", name) from None
    elif type(value) is list:
        for i, item in enumerate(value):
            _check_value(f"{name}[{i}]", item)


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: dict[str, object] = {}
        for key, value in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key!r} (values {short_repr(seen[key], 40)} and "
                               f"{short_repr(value, 40)}): a record's keys must be unique", key)
            seen[key] = value
    for key, value in pairs:
        _check_value(key, key)
        _check_value(key, value)
    return record


#: Kinds that are whole documents rather than rows of the world model (decode still reads NaN/Infinity in them).
DOCUMENT_KINDS = frozenset({"audit_record", "replay_result"})


#: The reason a null record value (a Kafka tombstone) is refused with.
TOMBSTONE = "null value (tombstone) where a record was expected"


def parse(kind: str, raw: bytes | str | None, *, finite: bool = True) -> object:
    """Parse one JSON value strictly, as the store can keep it; raise SchemaError naming what it refuses.

    Refused beyond what `json.loads` refuses: NaN, Infinity and numbers beyond a 64-bit float (1e400; unless
    `finite` is False), duplicate keys (Python keeps the last value, the NDJSON reader of the store the
    first), lone UTF-16 surrogate escapes, nesting beyond the interpreter's recursion limit and integers over
    Python's digit limit.

    Parameters
    ----------
    kind : record kind, for the error (one of ``KINDS``, or a field-map source name).
    raw : UTF-8 JSON text (bytes) as it came off the wire; None (a Kafka tombstone) is refused.
    finite : refuse non-finite numbers (False: read them as Python's json does, as float nan/inf).
    """
    if raw is None:
        raise SchemaError(kind, TOMBSTONE)
    constant, number = (_NonFinite, _float) if finite else (None, float)
    try:
        value = json.loads(raw, parse_constant=constant, parse_float=number, object_pairs_hook=_object)
    except _Refused as exc:
        raise SchemaError(kind, exc.reason, exc.field) from None
    except RecursionError:
        raise SchemaError(kind, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer over the digit limit
        raise SchemaError(kind, f"invalid JSON: {_cut(str(exc), 200)}") from None
    if type(value) is _NonFinite:
        raise SchemaError(kind, f"record must be a JSON object, got the non-finite number {value.text}")
    return value


# --- storage ranges ---------------------------------------------------------------------------------------


def _storage_checks(kind: str) -> list[tuple[str, bool, bool, int, int]]:
    """Per numeric field of a fixed-shape kind: (name, is_list, is_int, min, max) from its stored type."""
    from schemas import records  # schemas.records imports this module: load it on first use

    if kind not in records.RECORD_TYPES:
        return []
    checks = []
    for name, dtype in records.stored_schema(kind).items():
        inner = getattr(dtype, "inner", None)
        item = inner if inner is not None else dtype
        bounds = records.int_range(item)
        if bounds is not None:
            checks.append((name, inner is not None, True, *bounds))
        elif item.is_float():
            checks.append((name, inner is not None, False, 0, 0))
    return checks


def _storage_error(kind: str, name: str, value: object, is_int: bool, lo: int, hi: int) -> SchemaError | None:
    if is_int:
        if lo <= value <= hi:  # type: ignore[operator]
            return None
        bits = 32 if hi < 2**32 else 64
        return SchemaError(kind, f"field {name!r} must fit the stored Int{bits} ({lo}..{hi}) "
                           f"(got {short_repr(value)})", name)
    try:
        if math.isfinite(value):  # type: ignore[arg-type]
            return None
    except OverflowError:  # an integer beyond a 64-bit float
        pass
    return SchemaError(kind, f"field {name!r} must be a finite number (got {short_repr(value)})", name)


def _check_storage(kind: str, checks: list[tuple[str, bool, bool, int, int]], record: dict[str, Any]) -> None:
    for name, is_list, is_int, lo, hi in checks:
        value = record.get(name)
        if value is None:
            continue
        for i, item in enumerate(value) if is_list else ((None, value),):
            err = _storage_error(kind, name if i is None else f"{name}[{i}]", item, is_int, lo, hi)
            if err is not None:
                raise err


def _reason(kind: str, exc: fastjsonschema.JsonSchemaValueException, record: object) -> SchemaError:
    """Turn fastjsonschema's exception into a SchemaError naming the field."""
    path = exc.name.removeprefix("data").lstrip(".") or None
    definition = exc.definition if isinstance(exc.definition, dict) else {}
    value = exc.value
    if exc.rule == "required" and isinstance(value, dict):
        missing = [f for f in definition.get("required", []) if f not in value]
        names = [f"{path}.{f}" if path else f for f in missing]
        return SchemaError(kind, f"missing required field(s) {_quote(names)}", names[0] if names else path)
    if exc.rule == "additionalProperties" and isinstance(value, dict):
        extra = sorted(set(value) - set(definition.get("properties", {})))
        names = [f"{path}.{f}" if path else f for f in extra]
        return SchemaError(
            kind, f"unexpected field(s) {_quote(names)} (not in {kind} v{SCHEMA_VERSION})", names[0]
        )
    if path is None:
        if not isinstance(record, dict):
            return SchemaError(kind, f"record must be a JSON object, got {type(record).__name__}")
        return SchemaError(kind, _cut(exc.message.removeprefix("data ").strip(), 300))
    detail = _cut(exc.message.removeprefix(exc.name).strip(), 300)
    if exc.rule == "format" and definition.get("format") == "date-time":
        detail = "must be an RFC 3339 date-time with offset, e.g. 2023-07-01T13:00:00Z"
    return SchemaError(kind, f"field {path!r} {detail} (got {short_repr(value)})", path)


@cache
def validator(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Return the compiled validator of ``kind`` (cached): it returns the record or raises SchemaError.

    Besides the JSON Schema, a fixed-shape kind's numbers must fit the types they are stored as (integers
    within Int32/Int64, floats finite; `schemas.records.stored_schema`).

    Parameters
    ----------
    kind : record kind, one of ``KINDS``.
    """
    compiled = fastjsonschema.compile(load(kind))
    storage = _storage_checks(kind)

    def check(record: dict[str, Any]) -> dict[str, Any]:
        try:
            out = compiled(record)
        except fastjsonschema.JsonSchemaValueException as exc:
            raise _reason(kind, exc, record) from None
        if storage:
            _check_storage(kind, storage, out)
        return out

    check.__name__ = f"validate_{kind}"
    return check


def validate(kind: str, record: dict[str, Any]) -> dict[str, Any]:
    """Validate ``record`` as ``kind`` and return it; raise SchemaError with the reason otherwise."""
    return validator(kind)(record)


def decode(kind: str, raw: bytes | None) -> dict[str, Any]:
    """Parse a UTF-8 JSON record value and validate it as ``kind``.

    Parameters
    ----------
    kind : record kind, one of ``KINDS``.
    raw : the record value as it came off the wire (bytes).

    Raises
    ------
    SchemaError
        reason ``"invalid JSON: ..."`` when ``raw`` does not parse, what `parse` refuses (non-finite number,
        duplicate key, ...), else the schema or storage-range violation. The ``DOCUMENT_KINDS`` (audit
        records, replay results) may hold NaN/Infinity, as before.
    """
    check = validator(kind)
    return check(parse(kind, raw, finite=kind not in DOCUMENT_KINDS))  # type: ignore[arg-type]
