"""Power / clock sampling: an `nvidia-smi -lms 100` loop and an NVML thread (board energy counter, mJ)."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import Runner

SMI_REQUIRED = ["timestamp", "power.draw", "clocks.sm", "utilization.gpu", "temperature.gpu"]
SMI_OPTIONAL = ["power.draw.instant", "clocks.mem", "utilization.memory", "clocks_event_reasons.active"]
SMI_STATIC = [
    "name",
    "driver_version",
    "pstate",
    "power.limit",
    "power.default_limit",
    "power.max_limit",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks.applications.graphics",
    "clocks.default_applications.graphics",
    "memory.total",
    "persistence_mode",
    "compute_mode",
    "pci.bus_id",
    "vbios_version",
]


def _smi(args: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess | None:
    """Run nvidia-smi once (timeout in s); None if it cannot start."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
    except Exception:  # noqa: BLE001
        return None


def smi_static(index: int) -> dict:
    """The SMI_STATIC fields of GPU index as strings (None where a field is refused)."""
    out: dict = {}
    r = _smi([f"--query-gpu={','.join(SMI_STATIC)}", "--format=csv,noheader,nounits", "-i", str(index)])
    if r is not None and r.returncode == 0 and r.stdout.strip():
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
        if len(vals) == len(SMI_STATIC):
            return dict(zip(SMI_STATIC, vals, strict=True))
    for f in SMI_STATIC:  # one field at a time: an unsupported field fails the whole query
        r = _smi([f"--query-gpu={f}", "--format=csv,noheader,nounits", "-i", str(index)])
        out[f] = r.stdout.strip() if r is not None and r.returncode == 0 else None
    return out


def smi_fields(index: int) -> list[str]:
    """SMI_REQUIRED plus the SMI_OPTIONAL fields this driver accepts."""
    fields = SMI_REQUIRED + SMI_OPTIONAL
    r = _smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", str(index)])
    if r is not None and r.returncode == 0:
        return fields
    keep = list(SMI_REQUIRED)
    for f in SMI_OPTIONAL:
        r = _smi([f"--query-gpu={','.join([*SMI_REQUIRED, f])}", "--format=csv,noheader,nounits", "-i", str(index)])
        if r is not None and r.returncode == 0:
            keep.append(f)
    return keep


def parse_smi_line(line: str, fields: list[str], t_read: float) -> dict | None:
    """One CSV sample: t (nvidia-smi's timestamp, epoch s), t_read (when read), floats; None if malformed."""
    vals = [v.strip() for v in line.strip().split(",")]
    if len(vals) != len(fields):
        return None
    row: dict = {"t_read": t_read}
    for f, v in zip(fields, vals, strict=True):
        if f == "timestamp":
            try:
                row["t"] = dt.datetime.strptime(v, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except ValueError:
                row["t"] = t_read
        elif f == "clocks_event_reasons.active":
            row[f] = v
        else:
            try:
                row[f] = float(v)
            except ValueError:
                row[f] = None  # [N/A], [Not Supported]
    row.setdefault("t", t_read)
    return row


class SmiSampler:
    """`nvidia-smi --query-gpu=... -lms 100` in the background; each line carries nvidia-smi's own timestamp,
    so pipe buffering cannot shift samples between phases."""

    def __init__(self, index: int, period_ms: int = 100):
        self.index, self.period_ms = index, period_ms
        self.fields = smi_fields(index)
        self.rows: list[dict] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> None:
        cmd = [
            "nvidia-smi",
            f"--query-gpu={','.join(self.fields)}",
            "--format=csv,noheader,nounits",
            "-i",
            str(self.index),
            "-lms",
            str(self.period_ms),
        ]
        if shutil.which("stdbuf"):
            cmd = ["stdbuf", "-oL", *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            row = parse_smi_line(line, self.fields, time.time())
            if row is not None:
                self.rows.append(row)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            self.proc.send_signal(signal.SIGINT)  # like Ctrl-C: nvidia-smi exits and flushes
            self.proc.wait(timeout=3)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=3)
        if self.thread is not None:
            self.thread.join(timeout=3)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        if err.strip():
            self.error = err.strip()[:500]


class NvmlSampler:
    """Secondary sampler through NVML (pynvml), mainly for the board energy counter (mJ)."""

    def __init__(self, index: int, period_s: float = 0.1):
        import pynvml  # noqa: PLC0415  (optional dependency)

        self.nv = pynvml
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s = period_s
        self.rows: list[dict] = []
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.energy_ok = self.energy_mj() is not None

    def energy_mj(self) -> float | None:
        try:
            return float(self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h))
        except Exception:  # noqa: BLE001
            return None

    def _run(self) -> None:
        nv = self.nv
        while not self.stop_ev.is_set():
            row: dict = {"t": time.time()}
            with contextlib.suppress(Exception):
                row["power_w"] = nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0
            with contextlib.suppress(Exception):
                row["sm_mhz"] = float(nv.nvmlDeviceGetClockInfo(self.h, nv.NVML_CLOCK_SM))
            with contextlib.suppress(Exception):
                row["util"] = float(nv.nvmlDeviceGetUtilizationRates(self.h).gpu)
            self.rows.append(row)
            self.stop_ev.wait(self.period_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(timeout=3)
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()


def start_samplers(r: Runner) -> None:
    """Start nvidia-smi and NVML sampling on the GPU (unless --no-smi); records what runs under res["sampling"]."""
    a = r.args
    info: dict = {}
    if r.dev.type == "cuda" and not a.no_smi and shutil.which("nvidia-smi"):
        try:
            r.smi = SmiSampler(a.smi_index)
            r.smi.start()
            info["nvidia_smi_fields"] = r.smi.fields
            info["nvidia_smi_period_ms"] = r.smi.period_ms
        except Exception as e:  # noqa: BLE001
            r.err("nvidia-smi sampler", e)
            r.smi = None
    else:
        info["nvidia_smi"] = "not used (dry run, --no-smi, or not found)"
    if r.dev.type == "cuda" and not a.no_smi:
        try:
            r.nvml = NvmlSampler(a.smi_index)
            r.nvml.start()
            info["nvml"] = {"energy_counter": r.nvml.energy_ok}
        except Exception as e:  # noqa: BLE001
            info["nvml"] = f"unavailable: {e!r}"[:200]
            r.nvml = None
    info["power_draw_semantics"] = (
        "nvidia-smi power.draw is a ~1 s average on Ampere and newer; "
        "power.draw.instant is instantaneous; energy_counter_power_w is "
        "(NVML total energy delta)/(phase duration) over the whole phase"
    )
    r.res["sampling"] = info
