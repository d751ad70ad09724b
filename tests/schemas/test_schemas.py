"""The wire contract files: shape, valid samples, and rejections whose reason names the field."""

from __future__ import annotations

import copy
import json
from importlib.resources import files
from pathlib import Path

import pytest

import schemas
from schemas import KINDS, SchemaError, decode, load, validate, validator

FIXED = ("request_arrival", "request_completion", "gpu_telemetry", "price", "fleet_event", "dead_letter")
T0, T1 = "2023-07-01T13:00:00Z", "2023-07-01T13:00:00.250000Z"

SAMPLES: dict[str, dict] = {
    "request_arrival": {
        "schema_version": "1",
        "request_id": "req-1",
        "event_at": T0,
        "arrived_at": T1,
        "request_class": "chat",
        "model": "llama-3.1-70b",
        "input_tokens": 1020,
        "prefix_block_ids": [11, 12],
        "site": "pjm-1",
        "tenant": "acme",
        "allowed_regions": ["us-east"],
        "sla_ttft_ms": 2000.0,
        "sla_tpot_ms": 100.0,
        "deadline_at": None,
    },
    "request_completion": {
        "schema_version": "1",
        "request_id": "req-1",
        "event_at": "2023-07-01T13:00:09Z",
        "arrived_at": T1,
        "request_class": "chat",
        "model": "llama-3.1-70b",
        "site": "pjm-1",
        "replica_id": "r-70b-0",
        "gpu_type": "H100",
        "input_tokens": 1020,
        "output_tokens": 201,
        "cached_input_tokens": 512,
        "queued_at": T0,
        "first_token_at": "2023-07-01T13:00:01Z",
        "ttft_s": 1.0,
        "tpot_s": 0.04,
        "e2e_s": 9.0,
        "sla_met": True,
        "finish_reason": "stop",
    },
    "gpu_telemetry": {
        "schema_version": "1",
        "event_at": T0,
        "arrived_at": T1,
        "site": "pjm-1",
        "hostname": "node-01",
        "gpu": 3,
        "uuid": "GPU-5f1c",
        "modelName": "NVIDIA H100 80GB HBM3",
        "replica_id": "r-70b-0",
        "model_name": "llama-3.1-70b",
        "DCGM_FI_DEV_POWER_USAGE": 512.3,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1.2e9,
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_GPU_UTIL": 87,
        "DCGM_FI_DEV_FB_USED": 70100,
        "DCGM_FI_DEV_GPU_TEMP": 64,
        "num_requests_running": 42,
        "num_requests_waiting": 3,
        "kv_cache_usage_perc": 0.61,
    },
    "price": {
        "schema_version": "1",
        "market": "ERCOT",
        "location": "HB_HOUSTON",
        "market_run": "DAY_AHEAD_HOURLY",
        "interval_start": "2023-07-10T05:00:00Z",
        "interval_end": "2023-07-10T06:00:00Z",
        "lmp_usd_mwh": -3.2,
        "published_at": "2023-07-09T18:00:00Z",
        "event_at": "2023-07-10T05:00:00Z",
        "arrived_at": T1,
    },
    "fleet_event": {
        "schema_version": "1",
        "event_at": T0,
        "arrived_at": T1,
        "site": "pjm-1",
        "replica_id": "r-70b-0",
        "model": "llama-3.1-70b",
        "gpu_type": "H100",
        "kind": "replica_ready",
        "tp": 4,
        "precision": "fp8",
        "kv_cache_dtype": "fp8",
        "sm_clock_mhz": 1980,
        "max_batch": 256,
        "hostnames": ["node-01"],
    },
    "dead_letter": {
        "schema_version": "1",
        "reason": "missing required field(s) 'site'",
        "original_value_b64": "e30=",
        "source_topic": "aurelius.gpu_telemetry",
        "source_partition": 0,
        "source_offset": 17,
        "failed_at": T1,
        "error_class": "schemas.SchemaError",
    },
    "audit_record": {
        "schema_version": "1",
        "decision_id": "d-1",
        "policy": "aurelius",
        "markets": ["PJM"],
        "period_index": 0,
        "period_start": T0,
        "as_of": T0,
        "inputs": {"pue": {"value": 1.3, "provenance": "modeled"}},
        "forecasts": {
            "arrivals_chat_per_s": {
                "point": 40.0,
                "lo80": 35.0,
                "hi80": 45.0,
                "lo95": 32.0,
                "hi95": 48.0,
                "confidence": 0.9,
            }
        },
        "candidates_evaluated": 31,
        "top_candidates": [{"plan": {"label": "a"}, "predicted": {"gp_per_dollar": 9}}],
        "gates": [{"name": "sla", "passed": True, "reason": "chat 0.1% <= 1%"}],
        "chosen_plan": {"label": "a"},
        "fallback": False,
        "fallback_reason": None,
        "reference_plan": {"label": "prod"},
        "predicted_delta": {"gp_per_dollar": 1.2},
        "regret": 0.0,
        "realized": None,
    },
    "replay_result": {
        "schema_version": "1",
        "markets": {
            "PJM": {
                "window": {"start": T0, "end": "2023-07-01T16:00:00Z", "mean_price_usd_mwh": 212.5},
                "policies": {
                    "production": {
                        "offered": 500000,
                        "completed": 499000,
                        "sla_met": 480000,
                        "sla_violation_rate": 0.04,
                        "unfinished": 1000,
                        "gp_per_dollar": 52.1,
                        "tokens_sla_met_per_dollar": 10400.0,
                        "cost_usd": 9213.0,
                        "cost_usd_owned": 7000.0,
                        "gp_per_dollar_owned": 68.6,
                        "energy_mwh": 3.1,
                        "energy_share": 0.07,
                        "gpu_hours": 3300.0,
                        "ttft_p99_ms": 1800.0,
                        "tpot_p99_ms": 95.0,
                        "classes": {"chat": {"offered": 300000}},
                    }
                },
            }
        },
        "provenance": {"cost_usd": "modeled"},
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_schema_file_shape(kind):
    sch = load(kind)
    assert sch["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert sch["$id"].endswith(f"/{kind}.v1.schema.json") and sch["title"] and sch["description"]
    assert sch["properties"]["schema_version"]["const"] == "1"
    assert set(sch["required"]) <= set(sch["properties"])
    assert all(p.get("description") for p in sch["properties"].values()), "every field is described"
    assert sch["additionalProperties"] is (kind not in FIXED)
    assert files("schemas").joinpath(f"{kind}.v1.schema.json").is_file()


def test_units_and_names_follow_conventions():
    tel = load("gpu_telemetry")["properties"]
    assert "(W)" in tel["DCGM_FI_DEV_POWER_USAGE"]["description"]
    assert "mJ" in tel["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["description"]
    assert tel["kv_cache_usage_perc"]["maximum"] == 1 and tel["DCGM_FI_DEV_GPU_UTIL"]["maximum"] == 100
    for kind in FIXED:
        for name, prop in load(kind)["properties"].items():
            if name.endswith("_at") or name.startswith("interval_"):
                assert prop["format"] == "date-time", (kind, name)


@pytest.mark.parametrize("kind", KINDS)
def test_samples_validate_and_decode(kind):
    assert validate(kind, SAMPLES[kind]) == SAMPLES[kind]
    assert decode(kind, json.dumps(SAMPLES[kind]).encode()) == SAMPLES[kind]


def _without(kind, field):
    rec = copy.deepcopy(SAMPLES[kind])
    del rec[field]
    return rec


def _with(record_kind, /, **changes):
    return {**copy.deepcopy(SAMPLES[record_kind]), **changes}


REJECTIONS = [
    # (kind, record, field the reason must name, words the reason must contain)
    *[
        (k, _without(k, f), f, "missing")
        for k, f in [
            ("request_arrival", "request_id"),
            ("request_completion", "output_tokens"),
            ("gpu_telemetry", "hostname"),
            ("price", "published_at"),
            ("fleet_event", "kind"),
            ("dead_letter", "source_offset"),
            ("audit_record", "decision_id"),
            ("replay_result", "provenance"),
        ]
    ],
    ("request_arrival", _with("request_arrival", output_tokens=180), "output_tokens", "unexpected"),
    (
        "request_arrival",
        _with("request_arrival", input_tokens=-5),
        "input_tokens",
        "bigger than or equal to 0",
    ),
    ("request_arrival", _with("request_arrival", input_tokens=True), "input_tokens", "integer"),
    ("request_arrival", _with("request_arrival", request_class="interactive"), "request_class", "one of"),
    ("request_arrival", _with("request_arrival", event_at="2023-07-01 13:00"), "event_at", "RFC 3339"),
    ("request_completion", _with("request_completion", output_tokens=-1), "output_tokens", "bigger"),
    ("request_completion", _with("request_completion", finish_reason="timeout"), "finish_reason", "one of"),
    ("request_completion", _with("request_completion", sla_met="yes"), "sla_met", "boolean"),
    (
        "gpu_telemetry",
        _with("gpu_telemetry", DCGM_FI_DEV_POWER_USAGE="512"),
        "DCGM_FI_DEV_POWER_USAGE",
        "number",
    ),
    ("gpu_telemetry", _with("gpu_telemetry", kv_cache_usage_perc=61.0), "kv_cache_usage_perc", "smaller"),
    ("gpu_telemetry", _with("gpu_telemetry", power_w=500.0), "power_w", "unexpected"),
    ("gpu_telemetry", _with("gpu_telemetry", arrived_at="yesterday"), "arrived_at", "date-time"),
    ("price", _with("price", market_run="REAL_TIME_5_MIN"), "market_run", "one of"),
    ("price", _with("price", market="NYISO"), "market", "one of"),
    ("fleet_event", _with("fleet_event", precision="int4"), "precision", "one of"),
    ("fleet_event", _with("fleet_event", kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype", "one of"),
    ("fleet_event", _with("fleet_event", kind="replica_exploded"), "kind", "one of"),
    ("fleet_event", _with("fleet_event", tp=0), "tp", "bigger"),
    ("dead_letter", _with("dead_letter", source_partition=-1), "source_partition", "bigger"),
    ("dead_letter", _with("dead_letter", original_value_b64="not base64!"), "original_value_b64", "match"),
    (
        "audit_record",
        _with("audit_record", gates=[{"name": "sla", "passed": True}]),
        "gates[0].reason",
        "missing",
    ),
    ("audit_record", _with("audit_record", schema_version="2"), "schema_version", "const"),
    (
        "replay_result",
        _with("replay_result", markets={"PJM": {"window": {}}}),
        "markets.PJM.policies",
        "missing",
    ),
]


@pytest.mark.parametrize(
    ("kind", "record", "field", "words"), REJECTIONS, ids=lambda v: v if isinstance(v, str) else ""
)
def test_rejection_names_the_field(kind, record, field, words):
    with pytest.raises(SchemaError) as info:
        validate(kind, record)
    err = info.value
    assert err.kind == kind and isinstance(err, ValueError)
    assert field in err.reason and err.field is not None and field.startswith(err.field.split("[")[0])
    assert words in err.reason, err.reason


def test_arrival_rejects_output_length():
    with pytest.raises(SchemaError, match="output_tokens"):
        validate("request_arrival", _with("request_arrival", output_tokens=1))
    assert "output_tokens" not in load("request_arrival")["properties"]


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b""])
def test_invalid_json(raw):
    with pytest.raises(SchemaError) as info:
        decode("price", raw)
    assert info.value.reason.startswith("invalid JSON: ")


def test_non_object_record():
    with pytest.raises(SchemaError, match="JSON object"):
        decode("price", b"[1, 2]")


def test_validator_is_cached_and_load_is_a_copy():
    assert validator("price") is validator("price")
    load("price")["required"].clear()
    assert load("price")["required"]
    with pytest.raises(KeyError, match="unknown record kind"):
        load("recommendation")


SCHEMA_DIR = Path(schemas.__file__).parent
README_KINDS = (  # the table of schemas/README.md, in its order
    "request_arrival", "request_completion", "gpu_telemetry", "price", "fleet_event", "audit_record", "dead_letter",
    "replay_result",
)


def test_kinds_are_the_schema_files_present():
    """KINDS lists exactly the `<kind>.v1.schema.json` files shipped in schemas/, no more, no fewer."""
    on_disk = sorted(f.name.removesuffix(".v1.schema.json") for f in SCHEMA_DIR.glob("*.v1.schema.json"))
    assert on_disk == sorted(KINDS)
    assert len(set(KINDS)) == len(KINDS)
    for kind in on_disk:  # each file's $id names its own kind
        name = f"{kind}.v1.schema.json"
        assert json.loads((SCHEMA_DIR / name).read_text())["$id"].endswith(f"/{name}")


def test_kinds_follow_the_readme_table():
    rows = [line.split("|")[1].strip() for line in (SCHEMA_DIR / "README.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| kind ")]
    assert tuple(rows) == README_KINDS
    assert KINDS == README_KINDS
