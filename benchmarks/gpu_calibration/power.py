"""Power phases: idle and sustained decode/prefill marks, then their power/clock summary and the sample CSV."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .timing import capture_graph, sync

if TYPE_CHECKING:
    from .runner import Runner


def idle(r: Runner, name: str) -> None:
    """Mark an idle phase of cfg.idle_s seconds."""
    sync(r.dev)
    e0, t0 = r.energy(), time.time()
    time.sleep(r.cfg.idle_s)
    r.mark(name, t0, time.time(), e0, r.energy())


def sustain(r: Runner, name: str, step: Callable[[], object], unit: str, units_per_call: int) -> None:
    """Run step back to back for phase_s seconds, synchronizing about every 0.1 s (not every call, so the
    queue never drains; not rarely, so the phase ends on time)."""
    dev = r.dev
    sync(dev)
    t = time.perf_counter()
    step()
    sync(dev)
    sync_every = max(1, int(0.1 / max(time.perf_counter() - t, 1e-6)))
    e0, t0 = r.energy(), time.time()
    calls = 0
    while time.time() - t0 < r.cfg.phase_s:
        for _ in range(sync_every):
            step()
        calls += sync_every
        sync(dev)
    t1 = time.time()
    r.mark(
        name,
        t0,
        t1,
        e0,
        r.energy(),
        work_units=calls * units_per_call,
        unit=unit,
        unit_ms=(t1 - t0) * 1e3 / max(calls, 1),
    )


def power(r: Runner) -> None:
    """Sustained bf16 (and fp8 if time allows) decode at power_batch and prefill at power_prefill, then idle."""
    c, dev, m = r.cfg, r.dev, r.model
    if r.args.no_power:
        r.res["skipped"].append("power phases (--no-power)")
        return
    need = 2 * c.phase_s + c.idle_s + 10
    runs = [("bf16", False)] + ([("fp8", True)] if r.fp8_ok and r.left() > 2 * need else [])
    if r.left() < need:
        r.res["skipped"].append("power phases (time budget)")
        return
    for prec, fp8 in runs:
        xb = torch.randn(c.power_batch, c.hidden, device=dev, dtype=r.dtype, generator=m.gen)

        def step(xb=xb, fp8=fp8):
            return m.decode(xb, r.kv, c.ctx, fp8)

        if dev.type == "cuda" and not r.args.no_graphs:
            pg = r.power_graph
            g = pg[0] if (not fp8 and pg is not None) else None
            try:
                g = g or capture_graph(step)
                step = g.replay
            except Exception as e:  # noqa: BLE001
                r.err(f"power decode graph {prec}", e)
        sustain(r, f"decode_b{c.power_batch}_{prec}", step, "decode steps", 1)
        xp = torch.randn(c.power_prefill, c.hidden, device=dev, dtype=r.dtype, generator=m.gen)
        sustain(
            r,
            f"prefill_{c.power_prefill}_{prec}",
            lambda xp=xp, fp8=fp8: m.prefill(xp, r.kv_pre, fp8),
            "prefill passes",
            1,
        )
        r.log(f"power phases {prec} done")
    r.power_graph = None
    idle(r, "idle_after")


def _mean(xs: list) -> float | None:
    """Mean of the non-None values; None if there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize_phase(ph: dict, smi_rows: list[dict], nvml_rows: list[dict], skip_s: float) -> dict:
    """Means of power (W), clocks (MHz), utilization (%) and max temperature (C) over the samples of phase ph
    after its first skip_s seconds; power from the energy counter (W) over the whole phase where available."""
    t0, t1 = ph["t0"] + skip_s, ph["t1"]
    s = [r for r in smi_rows if t0 <= r["t"] <= t1]
    n = [r for r in nvml_rows if t0 <= r["t"] <= t1]
    out = {
        "phase": ph["name"],
        "duration_s": round(ph["t1"] - ph["t0"], 3),
        "window_skip_s": skip_s,
        "smi_samples": len(s),
        "power_w_mean": _mean([r.get("power.draw") for r in s]),
        "power_instant_w_mean": _mean([r.get("power.draw.instant") for r in s]),
        "sm_clock_mhz_mean": _mean([r.get("clocks.sm") for r in s]),
        "sm_clock_mhz_min": min((r["clocks.sm"] for r in s if r.get("clocks.sm") is not None), default=None),
        "sm_clock_mhz_max": max((r["clocks.sm"] for r in s if r.get("clocks.sm") is not None), default=None),
        "mem_clock_mhz_mean": _mean([r.get("clocks.mem") for r in s]),
        "util_gpu_mean": _mean([r.get("utilization.gpu") for r in s]),
        "util_mem_mean": _mean([r.get("utilization.memory") for r in s]),
        "temp_c_max": max((r["temperature.gpu"] for r in s if r.get("temperature.gpu") is not None), default=None),
        "clock_event_reasons": sorted(
            {r["clocks_event_reasons.active"] for r in s if r.get("clocks_event_reasons.active")}
        ),
        "nvml_samples": len(n),
        "nvml_power_w_mean": _mean([r.get("power_w") for r in n]),
        "nvml_sm_clock_mhz_mean": _mean([r.get("sm_mhz") for r in n]),
    }
    for key in ("e0_mj", "e1_mj"):
        if ph.get(key) is None:
            break
    else:
        out["energy_counter_power_w"] = (ph["e1_mj"] - ph["e0_mj"]) / 1000.0 / max(ph["t1"] - ph["t0"], 1e-9)
    for key in ("work_units", "unit", "unit_ms"):
        if key in ph:
            out[key] = ph[key]
    return out


def finish_power(r: Runner) -> None:
    """Summarize each marked phase into res["power"] (W, MHz, J per work unit), clocks seen, and write the CSV."""
    smi_rows = r.smi.rows if r.smi is not None else []
    nvml_rows = r.nvml.rows if r.nvml is not None else []
    phases = []
    for ph in r.phases:
        skip = 0.5 if ph["name"].startswith("idle") else min(1.0, 0.25 * (ph["t1"] - ph["t0"]))
        s = summarize_phase(ph, smi_rows, nvml_rows, skip)
        p_w = s.get("energy_counter_power_w") or s.get("power_w_mean") or s.get("nvml_power_w_mean")
        if p_w and ph.get("work_units"):
            s["energy_j_per_unit"] = p_w * s["duration_s"] / ph["work_units"]
        phases.append(s)
    r.res["power"] = {"phases": phases}
    if r.smi is not None:
        r.res["power"]["smi_error"] = r.smi.error
        r.res["power"]["smi_samples_total"] = len(smi_rows)
        lags = [row["t_read"] - row["t"] for row in smi_rows]
        if lags:
            r.res["power"]["smi_read_lag_s_median"] = statistics.median(lags)
        sm = [row.get("clocks.sm") for row in smi_rows if row.get("clocks.sm") is not None]
        if sm:
            r.res["clocks_seen"] = {
                "sm_mhz_min": min(sm),
                "sm_mhz_max": max(sm),
                "sm_mhz_distinct": sorted(set(sm))[:40],
            }
        mem = [row.get("clocks.mem") for row in smi_rows if row.get("clocks.mem") is not None]
        if mem:
            r.res.setdefault("clocks_seen", {}).update({"mem_mhz_min": min(mem), "mem_mhz_max": max(mem)})
        csv = r.out_dir / "gpu_calibration_smi.csv"
        cols = ["t", "t_read", *[f for f in r.smi.fields if f != "timestamp"]]
        with csv.open("w") as fh:
            fh.write(",".join(cols) + "\n")
            for row in smi_rows:
                fh.write(",".join("" if row.get(k) is None else str(row.get(k)) for k in cols) + "\n")
        r.res["power"]["samples_file"] = csv.name
        r.res["power"]["phase_marks"] = [{k: ph[k] for k in ("name", "t0", "t1")} for ph in r.phases]
