"""`aurelius audit export`: one decision's chosen plan in the form of the actuator an operator applies it with.

Aurelius never applies any of it; it prints (or writes) what a person or a pipeline would review and apply:

- `hpa`: a `v1 List` of Kubernetes `autoscaling/v2` HorizontalPodAutoscalers, one per pool (Deployment
  `<model>-<gpu>` by default, `--deployment` to change), minReplicas/maxReplicas from the pool's replica
  floor/ceiling and a Pods metric target: running sequences per replica = autoscale_target x max_batch
  (the batch-slot occupancy the simulator's HPA-like autoscaler holds), and the `behavior` the plan was simulated
  under, scale-up at once and scale-down after 300 s (KEDA's `advanced.horizontalPodAutoscalerConfig`). Apply
  with `kubectl apply -f`, or use one item as a merge patch of an existing HPA
  (`kubectl patch hpa NAME --type merge --patch-file`).
- `keda`: KEDA `ScaledObject`s (keda.sh/v1alpha1) with the same bounds and a Prometheus trigger on vLLM's
  `vllm:num_requests_running`; unlike the HPA, KEDA can hold a floor of 0.
- `nvidia-smi`: the SM clock per pool as `nvidia-smi -i <GPUs> -lgc MHz,MHz` (lock), or `-rgc` (reset to the
  default boost) where the plan keeps the maximum clock; the GPU indices come from an environment variable
  named after the pool, since the audit record does not know the node layout.
- `vllm`: `vllm serve` arguments per pool: --tensor-parallel-size, --quantization fp8 (fp8 weights),
  --kv-cache-dtype, --max-num-seqs (max_batch), --max-num-batched-tokens (the plan's value, else the serving
  model's prefill chunk).
- `deferral`: the hold/release list for deferrable work (JSON): the plan's batch admission mode, which
  deferrable classes are held or released this period, and the carry-over the plan predicts. The record holds
  no per-request list: the runtime's admission control applies the mode to each request's deadline slack.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schemas.fleet import SM_CLOCK_RANGE_MHZ, default_max_num_batched_tokens
from schemas.protocol import Protocol
from sinks import sql
from worldmodel.transients import AUTOSCALER_STABILIZATION_S

FORMATS = ("hpa", "keda", "nvidia-smi", "vllm", "deferral")
#: Hugging Face ids of the served models (schemas/models.py: the Meta Llama 3.1 releases).
HF_MODEL_IDS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
}
#: The per-pod metric the HPA and KEDA targets name (vLLM's gauge of running sequences; through
#: prometheus-adapter the HPA sees it without the colon).
HPA_METRIC = "vllm_num_requests_running"
KEDA_QUERY = 'sum(vllm:num_requests_running{{model_name="{model}"}})'
DEFAULT_DEPLOYMENT = "{model}-{gpu}"
ANNOTATION = "aurelius.dev"


class ExportError(ValueError):
    """The decision is not in the audit log, or its record has no plan to export."""


def find_record(audit_dir: str | Path, decision: str) -> dict[str, Any]:
    """The audit record of `decision`: its decision id, a replay record's live decision id, or a unique prefix
    of either."""
    if not decision.strip():
        raise ExportError("an empty decision id")
    d = decision.replace("'", "''")
    df = sql.query(
        f"SELECT decision_id, record FROM audit WHERE decision_id = '{d}' "
        f"OR json_extract_string(record, '$.live_decision_id') = '{d}' "
        f"OR starts_with(decision_id, '{d}') ORDER BY decision_id",
        audit_dir,
    )
    rows = df.rows()
    exact = [r for r in rows if r[0] == decision]
    if exact:
        rows = exact
    elif len(rows) > 1:
        live = [r for r in rows if json.loads(r[1]).get("live_decision_id") == decision]
        if live and len(live) < len(rows):
            rows = live
    if not rows:
        raise ExportError(f"no decision {decision!r} in {audit_dir}")
    if len(rows) > 1:
        ids = ", ".join(r[0] for r in rows[:5])
        raise ExportError(f"{decision!r} matches {len(rows)} decisions ({ids}...): give the full decision id")
    record = json.loads(rows[0][1])
    if not isinstance(record.get("chosen_plan"), Mapping) or not record["chosen_plan"].get("pools"):
        raise ExportError(f"decision {rows[0][0]} has no chosen plan with pools to export")
    return record


def _dns(s: str) -> str:
    """A DNS-1123 label: lowercase alphanumerics and '-'."""
    out = re.sub(r"[^a-z0-9-]+", "-", s.lower()).strip("-")
    return out[:63].rstrip("-") or "pool"


def deployment_name(pool: Mapping[str, Any], template: str = DEFAULT_DEPLOYMENT) -> str:
    return _dns(template.format(model=pool["model"], gpu=pool["gpu"], site=pool["site"]))


def _meta(record: Mapping[str, Any], pool: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {f"{ANNOTATION}/model": _dns(pool["model"]), f"{ANNOTATION}/gpu": _dns(pool["gpu"]),
                   f"{ANNOTATION}/site": _dns(pool["site"])},
        "annotations": {
            f"{ANNOTATION}/decision-id": str(record["decision_id"]),
            f"{ANNOTATION}/policy": str(record.get("policy")),
            f"{ANNOTATION}/period-start": str(record.get("period_start")),
            f"{ANNOTATION}/fallback": str(bool(record.get("fallback"))).lower(),
            f"{ANNOTATION}/note": "recommendation exported by aurelius audit export; not applied by Aurelius",
        },
    }


def _target_running(plan: Mapping[str, Any], pool: Mapping[str, Any]) -> int:
    """Running sequences per replica the autoscaler holds: autoscale_target x max_batch (at least 1)."""
    return max(1, round(float(plan.get("autoscale_target", 0.8)) * int(pool["max_batch"])))


def _bounds(plan: Mapping[str, Any], pool: Mapping[str, Any]) -> tuple[int, int]:
    """(floor, ceiling); a static plan (autoscale off) pins each pool at its floor."""
    floor, ceiling = int(pool["replica_floor"]), int(pool["replica_ceiling"])
    if not plan.get("autoscale", True):
        ceiling = floor
    return floor, max(floor, ceiling)


#: The autoscaler's `behavior` (autoscaling/v2) every plan is simulated and predicted under: scale-up at the next
#: 15 s sync (HPA's default window, 0 s), scale-down once the 300 s window's desired counts allow it
#: (worldmodel/transients.py). Written out so an HPA with other defaults does not run the plan differently.
BEHAVIOR: dict[str, Any] = {"scaleUp": {"stabilizationWindowSeconds": 0},
                            "scaleDown": {"stabilizationWindowSeconds": round(AUTOSCALER_STABILIZATION_S)}}


def hpa(record: Mapping[str, Any], template: str = DEFAULT_DEPLOYMENT) -> dict[str, Any]:
    """A `v1 List` of autoscaling/v2 HorizontalPodAutoscalers, one per pool with a ceiling above 0.

    The HPA's minReplicas is at least 1 (0 needs the HPAScaleToZero feature gate): a pool with floor 0 gets
    minReplicas 1 and says so in an annotation; a pool with ceiling 0 is left out (scale its Deployment to 0,
    or use `--format keda`)."""
    plan = record["chosen_plan"]
    items = []
    for pool in plan["pools"]:
        floor, ceiling = _bounds(plan, pool)
        if ceiling == 0:
            continue
        name = deployment_name(pool, template)
        meta = _meta(record, pool, name)
        if floor == 0:
            meta["annotations"][f"{ANNOTATION}/replica-floor"] = (
                "0: the HPA keeps at least 1 without the HPAScaleToZero feature gate; KEDA can hold 0"
            )
        items.append({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": meta,
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicas": max(1, floor),
                "maxReplicas": ceiling,
                "behavior": BEHAVIOR,
                "metrics": [{
                    "type": "Pods",
                    "pods": {"metric": {"name": HPA_METRIC},
                             "target": {"type": "AverageValue", "averageValue": str(_target_running(plan, pool))}},
                }],
            },
        })
    return {"apiVersion": "v1", "kind": "List", "items": items}


def keda(record: Mapping[str, Any], template: str = DEFAULT_DEPLOYMENT,
         prometheus: str = "http://prometheus.monitoring.svc:9090") -> dict[str, Any]:
    """A `v1 List` of KEDA ScaledObjects (keda.sh/v1alpha1), one per pool, floors of 0 kept."""
    plan = record["chosen_plan"]
    items = []
    for pool in plan["pools"]:
        floor, ceiling = _bounds(plan, pool)
        name = deployment_name(pool, template)
        items.append({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": _meta(record, pool, name),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicaCount": floor,
                "maxReplicaCount": ceiling,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
                "triggers": [{
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": prometheus,
                        "query": KEDA_QUERY.format(model=HF_MODEL_IDS.get(pool["model"], pool["model"])),
                        "threshold": str(_target_running(plan, pool)),
                    },
                }],
            },
        })
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _gpu_var(pool: Mapping[str, Any]) -> str:
    return "GPUS_" + re.sub(r"[^A-Z0-9]+", "_", f"{pool['site']}_{pool['model']}_{pool['gpu']}".upper()).strip("_")


def nvidia_smi(record: Mapping[str, Any]) -> str:
    """A shell script: per pool, lock its GPUs' SM clock at the plan's MHz (`-lgc F,F`), or reset it (`-rgc`)
    where the plan keeps the GPU type's default maximum."""
    plan = record["chosen_plan"]
    lines = [
        "#!/bin/sh",
        f"# SM clocks of decision {record['decision_id']} ({record.get('policy')}, "
        f"period {record.get('period_start')})",
        "# exported by `aurelius audit export`; not applied by Aurelius. Run as root on each node, with each",
        "# GPUS_* variable set to that pool's GPU indices on the node (e.g. GPUS_...=0,1,2,3).",
        "set -eu",
    ]
    for pool in plan["pools"]:
        mhz = int(pool["sm_clock_mhz"])
        lo, hi = {str(g): r for g, r in SM_CLOCK_RANGE_MHZ.items()}.get(str(pool["gpu"]), (mhz, mhz))
        if not lo <= mhz <= hi:
            raise ExportError(f"pool {pool['model']}/{pool['gpu']}: {mhz} MHz outside the GPU's {lo}-{hi} MHz")
        var = _gpu_var(pool)
        ids = f'"${{{var}:?set {var} to the GPU indices of {pool["model"]} on {pool["gpu"]}}}"'
        lines.append(f"# {pool['site']} {pool['model']} on {pool['gpu']}: {mhz} MHz "
                     f"({'default maximum' if mhz >= hi else 'locked below the maximum'})")
        if mhz >= hi:
            lines.append(f"nvidia-smi -i {ids} -rgc")
        else:
            lines.append(f"nvidia-smi -i {ids} -lgc {mhz},{mhz}")
    return "\n".join(lines) + "\n"


def vllm_args(pool: Mapping[str, Any]) -> list[str]:
    """`vllm serve` argv (after `vllm serve MODEL`) of one pool."""
    budget = pool.get("max_num_batched_tokens") or default_max_num_batched_tokens(pool["gpu"])
    args = ["--tensor-parallel-size", str(int(pool["tp"])), "--max-num-seqs", str(int(pool["max_batch"])),
            "--max-num-batched-tokens", str(int(budget)),
            "--kv-cache-dtype", str(pool.get("kv_dtype") or "auto")]
    if pool.get("precision") == "fp8":
        args += ["--quantization", "fp8"]
    return args


def vllm(record: Mapping[str, Any]) -> str:
    """One `vllm serve` command per pool, commented with the pool and its replica bounds."""
    lines = [f"# vLLM serving arguments of decision {record['decision_id']} ({record.get('policy')}, period "
             f"{record.get('period_start')}); exported by `aurelius audit export`, not applied by Aurelius.",
             "# A precision or KV-dtype change restarts the replica (weights reload)."]
    for pool in record["chosen_plan"]["pools"]:
        model = HF_MODEL_IDS.get(pool["model"], pool["model"])
        lines.append(f"# {pool['site']} {pool['model']} on {pool['gpu']}: replicas "
                     f"{pool['replica_floor']}..{pool['replica_ceiling']}, precision {pool.get('precision')}")
        lines.append(shlex.join(["vllm", "serve", model, *vllm_args(pool)]))
    return "\n".join(lines) + "\n"


def deferral(record: Mapping[str, Any]) -> dict[str, Any]:
    """The hold/release list of deferrable work for the decision's period."""
    plan = record["chosen_plan"]
    mode = str(plan.get("batch_admission", "pressure"))
    proto = Protocol()
    deferrable = [c for c in proto.classes if c.deferrable]
    rule = {
        "hold": "hold: not admitted this period; each request is released when its deadline slack runs low",
        "pressure": "admit while the interactive queues are not backed up; hold while they are",
        "immediate": "release: admit at once",
    }.get(mode, mode)
    predicted = record.get("chosen_predicted") or {}
    return {
        "decision_id": record["decision_id"],
        "policy": record.get("policy"),
        "period_start": record.get("period_start"),
        "period_s": proto.period_s,
        "batch_admission": mode,
        "hold": [str(c.name) for c in deferrable] if mode == "hold" else [],
        "release": [str(c.name) for c in deferrable] if mode == "immediate" else [],
        "conditional": [str(c.name) for c in deferrable] if mode == "pressure" else [],
        "rule": rule,
        "deadlines_s": {str(c.name): [c.deadline_min_s, c.deadline_max_s] for c in deferrable},
        "predicted_deferred_carryover": predicted.get("deferred_carryover"),
        "note": "per-request lists are not in the audit record: the runtime applies the mode to each request's "
                "deadline slack. Exported by `aurelius audit export`; not applied by Aurelius.",
    }


def export(record: Mapping[str, Any], fmt: str, template: str = DEFAULT_DEPLOYMENT) -> str:
    """The decision's plan in format `fmt` (one of FORMATS) as text."""
    if fmt == "hpa":
        return json.dumps(hpa(record, template), indent=2) + "\n"
    if fmt == "keda":
        return json.dumps(keda(record, template), indent=2) + "\n"
    if fmt == "nvidia-smi":
        return nvidia_smi(record)
    if fmt == "vllm":
        return vllm(record)
    if fmt == "deferral":
        return json.dumps(deferral(record), indent=2) + "\n"
    raise ExportError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def run(args: argparse.Namespace) -> int:
    try:
        record = find_record(args.audit_dir, args.decision)
        text = export(record, args.format, args.deployment)
    except ExportError as exc:
        print(f"aurelius audit export: {exc}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
