"""`aurelius audit export`: each format checked against its own format: the HPAs against the pinned
autoscaling/v2 JSON schema, the vLLM arguments against a pinned snapshot of `vllm serve` flag names and choices,
the nvidia-smi lines against the pinned options of `nvidia-smi -h` and the GPU's clock range."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest

from schemas.fleet import SM_CLOCK_RANGE_MHZ
from sinks import audit_export
from sinks.audit_store import ParquetAuditStore
from streams.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
HPA_SCHEMA = json.loads((FIXTURES / "horizontalpodautoscaler-autoscaling-v2.json").read_text())
VLLM = json.loads((FIXTURES / "vllm_serve_flags.json").read_text())
#: `nvidia-smi -h` options used (NVIDIA driver R535+): -i/--id=ID[,ID...]; -lgc/--lock-gpu-clocks=MIN,MAX (MHz);
#: -rgc/--reset-gpu-clocks; -ac/--applications-clocks=MEM,GRAPHICS; -rac/--reset-applications-clocks.
NVIDIA_SMI_OPTIONS = {"-i": "ids", "--id": "ids", "-lgc": "pair", "--lock-gpu-clocks": "pair", "-rgc": None,
                      "--reset-gpu-clocks": None, "-ac": "pair", "--applications-clocks": "pair", "-rac": None,
                      "--reset-applications-clocks": None}


def _pool(model: str, gpu: str, floor: int, ceiling: int, tp: int, precision: str, kv: str, clock: int) -> dict:
    return {"site": "site-pjm", "model": model, "gpu": gpu, "replica_floor": floor, "replica_ceiling": ceiling,
            "tp": tp, "precision": precision, "kv_dtype": kv, "max_batch": 128, "sm_clock_mhz": clock}


PLAN = {"label": "aurelius: fp8 70b", "batch_admission": "hold", "autoscale": True, "autoscale_target": 0.75,
        "pools": [_pool("llama-3.1-8b", "H100", 2, 12, 1, "bf16", "auto", 1980),
                  _pool("llama-3.1-8b", "A100", 0, 4, 1, "bf16", "auto", 1410),
                  _pool("llama-3.1-70b", "H100", 4, 10, 4, "fp8", "fp8", 1500),
                  _pool("llama-3.1-70b", "A100", 0, 0, 8, "bf16", "auto", 1200)]}


def _record(i: int, plan: dict = PLAN) -> dict:
    return {"decision_id": f"dec{i:04d}", "live_decision_id": f"live{i}", "policy": "aurelius", "markets": ["PJM"],
            "period_index": i, "period_start": "2023-07-01T12:00:00Z", "as_of": "2023-07-01T12:00:00Z",
            "chosen_plan": plan, "reference_plan": None, "fallback": False, "fallback_reason": None,
            "chosen_predicted": {"deferred_carryover": 12.0}, "regret": None, "realized": None}


@pytest.fixture
def audit_dir(tmp_path):
    store = ParquetAuditStore(tmp_path / "audit")
    for i in range(3):
        store.add(_record(i))
    store.add({**_record(9), "decision_id": "other", "chosen_plan": {"label": "empty", "pools": []}})
    store.flush()
    return tmp_path / "audit"


def test_hpa_validates_against_the_pinned_autoscaling_v2_schema(audit_dir):
    doc = audit_export.hpa(audit_export.find_record(audit_dir, "dec0001"))
    assert doc["kind"] == "List"
    items = doc["items"]
    assert [i["metadata"]["name"] for i in items] == ["llama-3-1-8b-h100", "llama-3-1-8b-a100", "llama-3-1-70b-h100"]
    validator = jsonschema.Draft202012Validator(HPA_SCHEMA)
    for item in items:
        errors = list(validator.iter_errors(item))
        assert not errors, [e.message for e in errors]
    bounds = [(i["spec"]["minReplicas"], i["spec"]["maxReplicas"]) for i in items]
    assert bounds == [(2, 12), (1, 4), (4, 10)]  # floor 0 -> 1 (annotated); the ceiling-0 pool left out
    assert "aurelius.dev/replica-floor" in items[1]["metadata"]["annotations"]
    assert items[2]["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "96"  # 0.75 x 128
    # the behavior the plan was simulated under, not the cluster's defaults (scale-up at once, down after 300 s)
    assert {json.dumps(i["spec"]["behavior"], sort_keys=True) for i in items} == {json.dumps(
        {"scaleDown": {"stabilizationWindowSeconds": 300}, "scaleUp": {"stabilizationWindowSeconds": 0}})}
    # the schema is strict: a misspelt field is caught (the pinned copy really is checking)
    bad = json.loads(json.dumps(items[0]))
    bad["spec"]["maxReplica"] = bad["spec"].pop("maxReplicas")
    assert list(validator.iter_errors(bad))


def test_static_plan_pins_bounds(audit_dir):
    rec = {**_record(0), "chosen_plan": {**PLAN, "autoscale": False}}
    items = audit_export.hpa(rec)["items"]
    assert [(i["spec"]["minReplicas"], i["spec"]["maxReplicas"]) for i in items] == [(2, 2), (4, 4)]
    assert [(i["spec"]["minReplicaCount"], i["spec"]["maxReplicaCount"])
            for i in audit_export.keda(rec)["items"]] == [(2, 2), (0, 0), (4, 4), (0, 0)]


def test_keda_scaled_objects(audit_dir):
    items = audit_export.keda(audit_export.find_record(audit_dir, "dec0000"))["items"]
    for i in items:  # the fields KEDA's ScaledObject CRD requires, with their types
        assert i["apiVersion"] == "keda.sh/v1alpha1" and i["kind"] == "ScaledObject"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", i["metadata"]["name"])
        spec = i["spec"]
        assert isinstance(spec["scaleTargetRef"]["name"], str) and isinstance(spec["minReplicaCount"], int)
        assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == audit_export.BEHAVIOR
        trig = spec["triggers"][0]
        assert trig["type"] == "prometheus" and set(trig["metadata"]) == {"serverAddress", "query", "threshold"}
        assert all(isinstance(v, str) for v in trig["metadata"].values())
    assert [(i["spec"]["minReplicaCount"], i["spec"]["maxReplicaCount"]) for i in items] == [
        (2, 12), (0, 4), (4, 10), (0, 0)]


def _vllm_commands(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line and not line.startswith("#")]


def test_vllm_arguments_are_real_vllm_serve_flags(audit_dir):
    text = audit_export.export(audit_export.find_record(audit_dir, "dec0002"), "vllm")
    cmds = _vllm_commands(text)
    assert len(cmds) == 4
    known = set(VLLM["flags"])
    for argv in cmds:
        assert argv[:2] == ["vllm", "serve"] and argv[2].startswith("meta-llama/")
        args = argv[3:]
        it = iter(args)
        seen = {}
        for flag in it:
            assert flag in known, f"{flag} is not a `vllm serve` flag"
            assert flag in VLLM["flags_with_value"]
            value = next(it)
            seen[flag] = value
            if flag in VLLM["choices"]:
                assert value in VLLM["choices"][flag], (flag, value)
            if flag in VLLM["integer_flags"]:
                assert int(value) > 0
        assert {"--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype"} <= set(seen)
    fp8 = dict(zip(cmds[2][3::2], cmds[2][4::2], strict=True))
    assert fp8["--quantization"] == "fp8" and fp8["--kv-cache-dtype"] == "fp8" and fp8["--tensor-parallel-size"] == "4"
    assert fp8["--max-num-seqs"] == "128"
    assert "--quantization" not in cmds[0]


def test_nvidia_smi_commands(audit_dir):
    text = audit_export.export(audit_export.find_record(audit_dir, "live1"), "nvidia-smi")  # by live id
    assert text.startswith("#!/bin/sh")
    cmds = [shlex.split(line) for line in text.splitlines() if line.startswith("nvidia-smi")]
    pools = PLAN["pools"]
    assert len(cmds) == len(pools)
    ranges = {str(k): v for k, v in SM_CLOCK_RANGE_MHZ.items()}
    for argv, pool in zip(cmds, pools, strict=True):
        it = iter(argv[1:])
        opts = {}
        for opt in it:
            assert opt in NVIDIA_SMI_OPTIONS, f"{opt} is not an nvidia-smi option"
            opts[opt] = next(it) if NVIDIA_SMI_OPTIONS[opt] else None
        assert opts["-i"].startswith("${GPUS_") and opts["-i"].endswith("}")
        lo, hi = ranges[pool["gpu"]]
        if pool["sm_clock_mhz"] >= hi:
            assert "-rgc" in opts and "-lgc" not in opts
        else:
            a, b = (int(x) for x in re.fullmatch(r"(\d+),(\d+)", opts["-lgc"]).groups())
            assert a == b == pool["sm_clock_mhz"] and lo <= a <= hi
    bad = {**_record(0), "chosen_plan": {**PLAN, "pools": [{**pools[0], "sm_clock_mhz": 2500}]}}
    with pytest.raises(audit_export.ExportError, match="outside"):
        audit_export.nvidia_smi(bad)


def test_deferral_hold_release(audit_dir):
    rec = audit_export.find_record(audit_dir, "dec0000")
    held = audit_export.deferral(rec)
    assert held["hold"] == ["batch"] and held["release"] == [] and held["predicted_deferred_carryover"] == 12.0
    released = audit_export.deferral({**rec, "chosen_plan": {**PLAN, "batch_admission": "immediate"}})
    assert released["hold"] == [] and released["release"] == ["batch"]


def test_export_cli(audit_dir, tmp_path, capsys):
    out = tmp_path / "hpa.json"
    assert main(["audit", "export", "--decision", "dec0000", "--format", "hpa", "--audit-dir", str(audit_dir),
                 "--output", str(out), "--deployment", "vllm-{model}-{site}"]) == 0
    names = [i["metadata"]["name"] for i in json.loads(out.read_text())["items"]]
    assert names[0] == "vllm-llama-3-1-8b-site-pjm"
    assert main(["audit", "export", "--decision", "dec", "--format", "vllm", "--audit-dir", str(audit_dir)]) == 2
    assert "matches 3 decisions" in capsys.readouterr().err
    assert main(["audit", "export", "--decision", "nope", "--format", "vllm", "--audit-dir", str(audit_dir)]) == 2
    assert main(["audit", "export", "--decision", "other", "--format", "vllm", "--audit-dir", str(audit_dir)]) == 2
    assert "no chosen plan" in capsys.readouterr().err
    assert main(["audit", "export", "--decision", "dec0000", "--format", "deferral", "--audit-dir",
                 str(audit_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["hold"] == ["batch"]
