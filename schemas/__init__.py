"""The wire contract: one versioned JSON Schema per record kind (see schemas/README.md).

The ``*.v1.schema.json`` files are the source of truth; teams on an existing bus can validate against them
without Python. This module loads them as package data and validates with compiled (fastjsonschema)
validators, reporting every failure as a :class:`SchemaError` whose reason names the offending field.

Examples
--------
>>> try:
...     decode("price", b'{"schema_version": "1", "market": "NYISO"}')
... except SchemaError as exc:
...     print(exc.kind, exc.field)
price location
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any

import fastjsonschema

__all__ = ["KINDS", "SCHEMA_VERSION", "SchemaError", "decode", "load", "validate", "validator"]

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
        return SchemaError(kind, exc.message.removeprefix("data ").strip())
    detail = exc.message.removeprefix(exc.name).strip()
    if exc.rule == "format" and definition.get("format") == "date-time":
        detail = "must be an RFC 3339 date-time with offset, e.g. 2023-07-01T13:00:00Z"
    return SchemaError(kind, f"field {path!r} {detail} (got {value!r})", path)


@cache
def validator(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Return the compiled validator of ``kind`` (cached): it returns the record or raises SchemaError.

    Parameters
    ----------
    kind : record kind, one of ``KINDS``.
    """
    compiled = fastjsonschema.compile(load(kind))

    def check(record: dict[str, Any]) -> dict[str, Any]:
        try:
            return compiled(record)
        except fastjsonschema.JsonSchemaValueException as exc:
            raise _reason(kind, exc, record) from None

    check.__name__ = f"validate_{kind}"
    return check


def validate(kind: str, record: dict[str, Any]) -> dict[str, Any]:
    """Validate ``record`` as ``kind`` and return it; raise SchemaError with the reason otherwise."""
    return validator(kind)(record)


def decode(kind: str, raw: bytes) -> dict[str, Any]:
    """Parse a UTF-8 JSON record value and validate it as ``kind``.

    Parameters
    ----------
    kind : record kind, one of ``KINDS``.
    raw : the record value as it came off the wire (bytes).

    Raises
    ------
    SchemaError
        reason ``"invalid JSON: ..."`` when ``raw`` does not parse, else the schema violation.
    """
    check = validator(kind)
    try:
        record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(kind, f"invalid JSON: {exc}") from None
    return check(record)
