"""The fidelity table: simulated as-deployed outcomes beside the recorded ones (AID's observational test).

Rows: GPU-hours and GPU energy (telemetry-measured on both sides, `streams.history.recorded`), and per class
the violation rate and TTFT/TPOT p50/p99. Flags (the estimate's stated bounds): energy of either as-deployed
form, or the fitted policy's GPU-hours, more than `BOUND` off the recorded figure; a class's violation rate
more than `VIOLATION_BOUND_PP` off under either form. The imposed form's
GPU-hours match by construction (up to the period bounds), so it is judged on latency, violations, energy.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from schemas.protocol import CLASSES
from streams.history.recorded import Outcomes, class_outcome
from streams.replay.driver import RunResult
from streams.replay.metrics import request_outcomes
from worldmodel.groundtruth.state import TEL_DT

#: Relative error beyond which energy or the fitted policy's GPU-hours are flagged.
BOUND = 0.10
#: Violation-rate difference (percentage points) beyond which a class is flagged (the issue's target).
VIOLATION_BOUND_PP = 0.5


def simulated_outcomes(run: RunResult, gpu_hours: float) -> Outcomes:
    """A run's outcomes as the records would show them: `gpu_hours` (summarize's, telemetry-based), GPU energy
    from its telemetry samples (power x GPUs x sample interval), per-class latencies and violations."""
    rt, logs = run.runtime, run.runtime.logs
    n = int(logs.n_tel[0])
    tp = rt.pools.tp[rt.rep.pool[logs.tel_rep[:n]]]
    energy = float((logs.tel_power_w[:n] * tp).sum() * TEL_DT / 3.6e9)
    o = request_outcomes(run)
    classes = {}
    for k, name in enumerate(CLASSES):
        m = o["cls"] == k
        if m.any():
            done = m & o["done"]
            tpot = np.where(o["out"][done] > 1, o["tpot_s"][done], np.nan)
            classes[name] = class_outcome(int(m.sum()), int(o["sla_met"][m].sum()), o["ttft_s"][done], tpot)
    return Outcomes(gpu_hours, energy, classes)


def _rel(sim: float | None, rec: float | None) -> float | None:
    return None if sim is None or rec is None or rec == 0 else (sim - rec) / rec


def fidelity_table(recorded: Outcomes, simulated: dict[str, Outcomes]) -> dict[str, Any]:
    """results.json's fidelity record: per arm and figure the recorded, simulated and relative error (per-class
    violation rates as a difference in percentage points), and the flags outside `BOUND`."""
    arms: dict[str, Any] = {}
    flags: list[str] = []
    for arm, sim in simulated.items():
        rows: dict[str, Any] = {
            "gpu_hours": {
                "recorded": recorded.gpu_hours,
                "simulated": sim.gpu_hours,
                "rel_error": _rel(sim.gpu_hours, recorded.gpu_hours),
            },
            "gpu_energy_mwh": {
                "recorded": recorded.gpu_energy_mwh,
                "simulated": sim.gpu_energy_mwh,
                "rel_error": _rel(sim.gpu_energy_mwh, recorded.gpu_energy_mwh),
            },
        }
        for c, rec in recorded.classes.items():
            s = sim.classes.get(c)
            if s is None:
                continue
            rows[c] = {
                "recorded": asdict(rec),
                "simulated": asdict(s),
                "violation_pp": 100.0 * (s.violation_rate - rec.violation_rate),
            }
        arms[arm] = rows
        for c in recorded.classes:
            pp = rows.get(c, {}).get("violation_pp")
            if pp is not None and abs(pp) > VIOLATION_BOUND_PP:
                flags.append(f"{arm}: {c} violation rate {pp:+.2f} pp off the recorded (bound {VIOLATION_BOUND_PP} pp)")
        e = rows["gpu_energy_mwh"]["rel_error"]
        if e is not None and abs(e) > BOUND:
            flags.append(f"{arm}: GPU energy {e:+.1%} off the recorded figure (bound {BOUND:.0%})")
        g = rows["gpu_hours"]["rel_error"]
        if arm == "as-deployed" and g is not None and abs(g) > BOUND:
            flags.append(f"{arm}: GPU-hours {g:+.1%} off the recorded figure (bound {BOUND:.0%})")
    return {
        "bound": BOUND,
        "violation_bound_pp": VIOLATION_BOUND_PP,
        "arms": arms,
        "flags": flags,
        "within_bounds": not flags,
    }


def print_fidelity(table: dict[str, Any]) -> None:
    """The fidelity table, one block per as-deployed arm."""
    print("\nfidelity (simulated as-deployed vs recorded):")
    for arm, rows in table["arms"].items():
        print(f"  {arm}")
        for k in ("gpu_hours", "gpu_energy_mwh"):
            r = rows[k]
            rel = "" if r["rel_error"] is None else f"{r['rel_error']:+.1%}"
            print(f"    {k:<16}recorded {r['recorded']:>10.4f}  simulated {r['simulated']:>10.4f}  {rel:>7}")
        for c in CLASSES:
            if c not in rows:
                continue
            rec, sim = rows[c]["recorded"], rows[c]["simulated"]
            cells = "  ".join(
                f"{k.removesuffix('_ms')} {_f(rec[k])}/{_f(sim[k])}"
                for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")
            )
            print(
                f"    {c:<6}viol {100 * rec['violation_rate']:.2f}%/{100 * sim['violation_rate']:.2f}% "
                f"({rows[c]['violation_pp']:+.2f} pp)  {cells}  (recorded/simulated, ms)"
            )
    print("  flags: " + ("; ".join(table["flags"]) if table["flags"] else "none (within bounds)"))


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"
