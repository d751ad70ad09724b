"""Field maps on payloads in the exact shapes of CONVENTIONS.md: DCGM/vLLM via prometheus-kafka-adapter,
OpenTelemetry GenAI spans (OTLP/JSON), gridstatus LMP frame rows."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from schemas import SchemaError, validate
from streams.fieldmap import FieldMap, FieldMapError, fold_telemetry, price_published_at
from streams.units import convert

ARRIVED = datetime(2023, 7, 1, 13, 0, 1, tzinfo=UTC)
TS = "2023-07-01T13:00:00Z"
EASTERN, CENTRAL, PACIFIC = (
    ZoneInfo(z) for z in ("America/New_York", "America/Chicago", "America/Los_Angeles")
)
DCGM_LABELS = {
    "__name__": "DCGM_FI_DEV_POWER_USAGE",
    "gpu": "3",
    "UUID": "GPU-5f1c2a4e-0b7d-4c59-9f59-1b2c3d4e5f60",
    "pci_bus_id": "00000000:9A:00.0",
    "device": "nvidia3",
    "modelName": "NVIDIA H100 80GB HBM3",
    "Hostname": "node-01",
    "DCGM_FI_DRIVER_VERSION": "550.54.15",
    "container": "vllm",
    "namespace": "inference",
    "pod": "llama70b-0",
}


@pytest.fixture(scope="module")
def fm() -> FieldMap:
    return FieldMap.load()


def dcgm(name: str, value: str, **labels: str) -> dict:
    """One prometheus-kafka-adapter message (Telefonica README shape)."""
    return {
        "timestamp": TS,
        "value": value,
        "name": name,
        "labels": {**DCGM_LABELS, "__name__": name, **labels},
    }


def test_dcgm_sample_maps_to_partial_telemetry(fm):
    kind, rec = fm.apply("dcgm", dcgm("DCGM_FI_DEV_POWER_USAGE", "512.25"), arrived_at=ARRIVED)
    assert kind == "gpu_telemetry" and validate(kind, rec) is rec
    assert rec["DCGM_FI_DEV_POWER_USAGE"] == 512.25 and rec["DCGM_FI_DEV_SM_CLOCK"] is None
    assert (rec["hostname"], rec["gpu"], rec["uuid"]) == ("node-01", 3, DCGM_LABELS["UUID"])
    assert (rec["modelName"], rec["replica_id"], rec["model_name"]) == (
        "NVIDIA H100 80GB HBM3",
        "llama70b-0",
        None,
    )
    assert (
        rec["event_at"] == "2023-07-01T13:00:00.000000Z"
        and rec["arrived_at"] == "2023-07-01T13:00:01.000000Z"
    )
    assert rec["site"] == "default"


def test_dcgm_new_lowercase_labels(fm):
    labels = {k: v for k, v in DCGM_LABELS.items() if k not in ("Hostname", "UUID")}
    raw = {
        "timestamp": TS,
        "value": "1980",
        "name": "DCGM_FI_DEV_SM_CLOCK",
        "labels": labels | {"hostname": "node-02", "uuid": "GPU-abc", "site": "pjm-1"},
    }
    _, rec = fm.apply("dcgm", raw, arrived_at=ARRIVED)
    assert (rec["hostname"], rec["uuid"], rec["site"], rec["DCGM_FI_DEV_SM_CLOCK"]) == (
        "node-02",
        "GPU-abc",
        "pjm-1",
        1980.0,
    )


def test_fold_samples_of_one_gpu(fm):
    later = datetime(2023, 7, 1, 13, 0, 2, tzinfo=UTC)
    parts = [
        fm.apply("dcgm", dcgm("DCGM_FI_DEV_POWER_USAGE", "512.3"), arrived_at=ARRIVED)[1],
        fm.apply("dcgm", dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "123456789012"), arrived_at=later)[1],
        fm.apply("dcgm", dcgm("DCGM_FI_DEV_GPU_UTIL", "87", gpu="4"), arrived_at=ARRIVED)[1],
        fm.apply("dcgm", dcgm("DCGM_FI_DEV_GPU_TEMP", "64"), arrived_at=ARRIVED)[1],
        fm.apply(
            "vllm",
            {
                "timestamp": TS,
                "value": "3",
                "name": "vllm:num_requests_waiting",
                "labels": {"model_name": "llama-3.1-70b", "pod": "llama70b-0", "instance": "10.0.0.5:8000"},
            },
            arrived_at=ARRIVED,
        )[1],
    ]
    folded = fold_telemetry(parts)
    assert len(folded) == 3 and all(validate("gpu_telemetry", r) for r in folded)
    gpu3, gpu4, replica = folded
    assert (gpu3["gpu"], gpu3["DCGM_FI_DEV_POWER_USAGE"], gpu3["DCGM_FI_DEV_GPU_TEMP"]) == (3, 512.3, 64.0)
    assert gpu3["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 123456789012.0  # mJ kept
    assert gpu3["arrived_at"] == "2023-07-01T13:00:02.000000Z", "complete only when its last part arrived"
    assert gpu4["DCGM_FI_DEV_GPU_UTIL"] == 87.0 and gpu4["DCGM_FI_DEV_POWER_USAGE"] is None
    assert replica["gpu"] is None and replica["num_requests_waiting"] == 3


def test_otel_hardware_units_are_converted(fm):
    _, energy = fm.apply("dcgm", dcgm("hw_energy_joules_total", "1.5"), arrived_at=ARRIVED)
    _, util = fm.apply("dcgm", dcgm("hw_gpu_utilization_ratio", "0.87"), arrived_at=ARRIVED)
    assert energy["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 1500.0  # J -> mJ
    assert util["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx(87.0)  # ratio -> %


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        (dcgm("DCGM_FI_DEV_XID_ERRORS", "0"), "name", "unknown metric 'DCGM_FI_DEV_XID_ERRORS'"),
        (dcgm("DCGM_FI_DEV_POWER_USAGE", "NaN"), "DCGM_FI_DEV_POWER_USAGE", "not finite"),
        (dcgm("DCGM_FI_DEV_POWER_USAGE", "lots"), "DCGM_FI_DEV_POWER_USAGE", "not a number"),
        (dcgm("DCGM_FI_DEV_GPU_UTIL", "140"), "DCGM_FI_DEV_GPU_UTIL", "smaller than or equal to 100"),
        (
            dcgm("DCGM_FI_DEV_POWER_USAGE", "5", Hostname=None),
            "hostname",
            "no value (tried 'Hostname', 'hostname')",
        ),
        (dcgm("DCGM_FI_DEV_POWER_USAGE", "5", gpu="all"), "gpu", "not a GPU index"),
        (
            {
                "timestamp": "1688216400",
                "value": "5",
                "name": "DCGM_FI_DEV_POWER_USAGE",
                "labels": DCGM_LABELS,
            },
            "timestamp",
            "RFC 3339",
        ),
    ],
)
def test_dcgm_errors_name_the_field(fm, raw, field, words):
    with pytest.raises(FieldMapError) as info:
        fm.apply("dcgm", raw, arrived_at=ARRIVED)
    err = info.value
    assert isinstance(err, SchemaError) and err.kind == "gpu_telemetry" and err.source == "dcgm"
    assert err.field == field and words in err.reason and err.reason.startswith("dcgm: ")


@pytest.mark.parametrize("metric", ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"])
def test_vllm_gauges(fm, metric):
    raw = {
        "timestamp": "2023-07-01T13:00:00.5Z",
        "value": "0.734",
        "name": metric,
        "labels": {
            "__name__": metric,
            "engine": "0",
            "model_name": "meta-llama/Llama-3.1-8B-Instruct",
            "instance": "10.0.0.5:8000",
            "pod": "llama8b-2",
        },
    }
    kind, rec = fm.apply("vllm", raw, arrived_at=ARRIVED)
    assert kind == "gpu_telemetry" and rec["kv_cache_usage_perc"] == 0.734
    assert (rec["hostname"], rec["replica_id"], rec["gpu"]) == ("10.0.0.5", "llama8b-2", None)
    assert rec["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_vllm_counts_must_be_whole(fm):
    raw = {
        "timestamp": TS,
        "value": "2.5",
        "name": "vllm:num_requests_running",
        "labels": {"instance": "h:8000"},
    }
    with pytest.raises(FieldMapError, match="num_requests_running"):
        fm.apply("vllm", raw, arrived_at=ARRIVED)


def otel_span(**overrides) -> dict:
    """One OTLP/JSON span as the OTel Collector's kafka exporter (otlp_json) carries it."""
    attrs = {
        "gen_ai.operation.name": {"stringValue": "chat"},
        "gen_ai.provider.name": {"stringValue": "vllm"},
        "gen_ai.request.model": {"stringValue": "llama-3.1-70b"},
        "gen_ai.response.id": {"stringValue": "chatcmpl-8f2a"},
        "gen_ai.usage.input_tokens": {"intValue": "1020"},
        "gen_ai.usage.output_tokens": {"intValue": "201"},
        "gen_ai.usage.cache_read.input_tokens": {"intValue": "512"},
        "gen_ai.server.time_to_first_token": {"doubleValue": 1.25},
        "gen_ai.response.finish_reasons": {"arrayValue": {"values": [{"stringValue": "stop"}]}},
        "aurelius.request_class": {"stringValue": "chat"},
    } | overrides
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "chat llama-3.1-70b",
        "kind": 2,
        "startTimeUnixNano": "1688216400000000000",
        "endTimeUnixNano": "1688216410250000000",
        "attributes": [{"key": k, "value": v} for k, v in attrs.items()],
        "resource": {
            "attributes": [
                {"key": "service.instance.id", "value": {"stringValue": "llama70b-0"}},
                {"key": "aurelius.site", "value": {"stringValue": "pjm-1"}},
                {"key": "aurelius.gpu_type", "value": {"stringValue": "H100"}},
            ]
        },
    }


def test_otel_genai_span_to_completion(fm):
    kind, rec = fm.apply("otel_genai", otel_span(), arrived_at=ARRIVED)
    assert kind == "request_completion" and validate(kind, rec) is rec
    assert (rec["request_id"], rec["model"], rec["input_tokens"], rec["output_tokens"]) == (
        "chatcmpl-8f2a",
        "llama-3.1-70b",
        1020,
        201,
    )
    assert (rec["cached_input_tokens"], rec["replica_id"], rec["site"], rec["gpu_type"]) == (
        512,
        "llama70b-0",
        "pjm-1",
        "H100",
    )
    assert (
        rec["queued_at"] == "2023-07-01T13:00:00.000000Z" and rec["event_at"] == "2023-07-01T13:00:10.250000Z"
    )
    assert rec["first_token_at"] == "2023-07-01T13:00:01.250000Z" and rec["ttft_s"] == 1.25
    assert rec["tpot_s"] == pytest.approx(9.0 / 200)  # (completion - first token) / (output_tokens - 1)
    assert rec["e2e_s"] == pytest.approx(10.25) and rec["finish_reason"] == "stop"
    assert rec["sla_met"] is True  # chat: TTFT 1.25 s <= 2 s, TPOT 45 ms <= 100 ms


def test_otel_old_names_flat_attributes_and_sla(fm):
    span = otel_span()
    span["attributes"] = {
        "gen_ai.request.model": "llama-3.1-8b",
        "gen_ai.request.id": "req-9",
        "gen_ai.usage.prompt_tokens": 300,
        "gen_ai.usage.completion_tokens": 1,
        "gen_ai.latency.time_to_first_token": 1.5,
        "gen_ai.response.finish_reasons": ["tool_calls"],
        "aurelius.request_class": "code",
    }
    _, rec = fm.apply("otel_genai", span, arrived_at=ARRIVED)
    assert (rec["request_id"], rec["input_tokens"], rec["cached_input_tokens"]) == ("req-9", 300, 0)
    assert rec["tpot_s"] == 0.0 and rec["finish_reason"] == "stop"
    assert rec["sla_met"] is False  # code: TTFT 1.5 s > 1 s


def test_otel_batch_needs_deadline(fm):
    batch = {"aurelius.request_class": {"stringValue": "batch"}}
    with pytest.raises(FieldMapError) as info:
        fm.apply("otel_genai", otel_span(**batch), arrived_at=ARRIVED)
    assert info.value.field == "sla_met"
    deadline = {"aurelius.deadline_at": {"stringValue": "2023-07-01T14:00:00Z"}}
    assert fm.apply("otel_genai", otel_span(**batch, **deadline), arrived_at=ARRIVED)[1]["sla_met"] is True


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"aurelius.request_class": {"stringValue": ""}}, "request_class"),
        ({"gen_ai.usage.output_tokens": {"intValue": "-4"}}, "output_tokens"),
        (
            {"gen_ai.response.finish_reasons": {"arrayValue": {"values": [{"stringValue": "eos"}]}}},
            "finish_reason",
        ),
    ],
)
def test_otel_errors_name_the_field(fm, override, field):
    with pytest.raises(FieldMapError) as info:
        fm.apply("otel_genai", otel_span(**override), arrived_at=ARRIVED)
    assert info.value.field == field and field in info.value.reason


def test_otel_missing_attribute(fm):
    span = otel_span()
    span["attributes"] = [a for a in span["attributes"] if a["key"] != "gen_ai.response.id"]
    with pytest.raises(FieldMapError, match="request_id.*gen_ai.response.id"):
        fm.apply("otel_genai", span, arrived_at=ARRIVED)


def pjm_row(market: str = "REAL_TIME_HOURLY", hour: int = 14) -> dict:
    """PJM().get_lmp row: no Location column, Location Id an int, US/Eastern tz-aware times."""
    start = datetime(2023, 7, 10, hour, tzinfo=EASTERN)
    return {
        "Time": start,
        "Interval Start": start,
        "Interval End": start.replace(hour=hour + 1),
        "Market": market,
        "Location Id": 51217,
        "Location Name": "WESTERN HUB",
        "Location Short Name": "WESTERN HUB",
        "Location Type": "HUB",
        "LMP": 87.31,
        "Energy": 80.02,
        "Congestion": 6.12,
        "Loss": 1.17,
    }


def test_gridstatus_pjm_real_time(fm):
    kind, rec = fm.apply("gridstatus_pjm", pjm_row(), arrived_at=ARRIVED)
    assert kind == "price" and validate(kind, rec) is rec
    assert (rec["market"], rec["location"], rec["market_run"], rec["lmp_usd_mwh"]) == (
        "PJM",
        "51217",
        "REAL_TIME_HOURLY",
        87.31,
    )
    assert rec["interval_start"] == rec["event_at"] == "2023-07-10T18:00:00.000000Z"  # 14:00 EDT
    assert rec["published_at"] == rec["interval_end"] == "2023-07-10T19:00:00.000000Z"


def test_gridstatus_day_ahead_published_1300_local_day_before(fm):
    ercot = {
        "Time": datetime(2023, 7, 10, 0, tzinfo=CENTRAL),
        "Interval Start": datetime(2023, 7, 10, 0, tzinfo=CENTRAL),
        "Interval End": datetime(2023, 7, 10, 1, tzinfo=CENTRAL),
        "Location": "HB_HOUSTON",
        "Location Type": "Trading Hub",
        "Market": "DAY_AHEAD_HOURLY",
        "SPP": 41.5,
    }
    _, rec = fm.apply("gridstatus_ercot", ercot, arrived_at=ARRIVED)
    assert rec["published_at"] == "2023-07-09T18:00:00.000000Z" and rec["lmp_usd_mwh"] == 41.5  # 13:00 CDT
    caiso = {
        "Time": "2023-01-15T23:00:00-08:00",
        "Interval Start": "2023-01-15T23:00:00-08:00",
        "Interval End": "2023-01-16T00:00:00-08:00",
        "Market": "DAY_AHEAD_HOURLY",
        "Location": "TH_NP15_GEN-APND",
        "Location Type": "Trading Hub",
        "LMP": 180.0,
        "Energy": 170.0,
        "Congestion": 5.0,
        "Loss": 5.0,
        "GHG": 0.0,
    }
    _, rec = fm.apply("gridstatus_caiso", caiso, arrived_at=ARRIVED)
    assert rec["published_at"] == "2023-01-14T21:00:00.000000Z"  # 13:00 PST on Jan 14
    _, rec = fm.apply("gridstatus_pjm", pjm_row("DAY_AHEAD_HOURLY"), arrived_at=ARRIVED)
    assert rec["published_at"] == "2023-07-09T17:00:00.000000Z"  # 13:00 EDT the day before


def test_published_at_defers_to_availability():
    from schemas import availability

    start = datetime(2023, 7, 10, 5, tzinfo=UTC)
    end = datetime(2023, 7, 10, 6, tzinfo=UTC)
    for market, run in availability.MARKET_RUN.items():
        assert price_published_at(market, run, start, end) == availability.published_at(market, start)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({**pjm_row(), "Market": "REAL_TIME_5_MIN"}, "market_run"),
        ({**pjm_row(), "Interval Start": datetime(2023, 7, 10, 14), "Time": None}, "interval_start"),
        ({k: v for k, v in pjm_row().items() if k != "Location Id"}, "location"),
        ({**pjm_row(), "LMP": "n/a"}, "lmp_usd_mwh"),
    ],
)
def test_gridstatus_errors_name_the_field(fm, row, field):
    with pytest.raises(FieldMapError) as info:
        fm.apply("gridstatus_pjm", row, arrived_at=ARRIVED)
    assert info.value.field == field and info.value.kind == "price"


def test_unknown_source_and_non_object(fm):
    with pytest.raises(FieldMapError, match="unknown source"):
        fm.apply("nvml", {}, arrived_at=ARRIVED)
    with pytest.raises(FieldMapError, match="must be an object"):
        fm.apply("dcgm", ["not", "a", "dict"], arrived_at=ARRIVED)


def test_custom_map_and_unit_checks(tmp_path):
    path = tmp_path / "map.toml"
    path.write_text(
        '[defaults]\nsite = "lab"\n[sources.gauges]\nkind = "gpu_telemetry"\nshape = "prometheus"\n'
        '[sources.gauges.fields]\nhostname = ["host"]\ngpu = ["idx"]\n'
        '[sources.gauges.metrics]\npower_mw = { field = "DCGM_FI_DEV_POWER_USAGE", unit = "mW" }\n'
    )
    fm = FieldMap.load(path)
    raw = {"timestamp": TS, "value": "250000", "name": "power_mw", "labels": {"host": "n1", "idx": "0"}}
    _, rec = fm.apply("gauges", raw, arrived_at=ARRIVED)
    assert (rec["DCGM_FI_DEV_POWER_USAGE"], rec["site"], rec["gpu"]) == (250.0, "lab", 0)
    path.write_text(path.read_text().replace('unit = "mW"', 'unit = "ms"'))
    with pytest.raises(ValueError, match="cannot convert 'ms' to 'W'"):
        FieldMap.load(path)


def test_convert():
    assert convert(1.5, "J", "mJ") == 1500.0
    assert convert(87.0, "%", "ratio") == pytest.approx(0.87)
    assert convert(250.0, "ms", "s") == 0.25
    assert convert(0.05, "USD/kWh", "USD/MWh") == pytest.approx(50.0)
    with pytest.raises(ValueError):
        convert(1.0, "W", "s")
