"""The planner's own analytical serving model: a roofline over public hardware specs.

This is deliberately *not* the ground truth's calibrated tables (worldmodel/physics, which the planner may
not import). Step times come from bytes moved and FLOPs done per step, divided by public peak bandwidth and
compute, inflated by efficiency priors tagged ``modeled``; the correction factors that make it honest are
fitted online from observed TTFT/TPOT and DCGM power (worldmodel/selfcal.py) and passed in as
:class:`Corrections`.

Sources (public specs, REFERENCES.md): H100 SXM 3.35 TB/s HBM, 989 TFLOP/s dense bf16, 1,979 fp8, 700 W TDP;
A100 SXM 2.0 TB/s, 312 TFLOP/s bf16, 400 W TDP; Llama-3.1 layer shapes from the model cards; measured TPOT
at small batch is ~2.2x the pure bandwidth roofline (AIConfigurator rows), which is the decode prior here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import special

from schemas.fleet import SM_CLOCK_RANGE_MHZ, GpuType, kv_storage, power_limited_clock_mhz
from schemas.models import BYTES_PER_VALUE, MODELS
from schemas.provenance import Provenance


@dataclass(frozen=True)
class GpuSpec:
    """Public datasheet figures of one GPU type (per GPU).

    hbm_bytes_s : HBM bandwidth (B/s); bf16_flops, fp8_flops : dense peak (FLOP/s, 0 when unsupported);
    memory_bytes : HBM capacity (B); tdp_w, idle_w : board power (W); link_bytes_s : NVLink per direction
    (B/s); max_clock_mhz : boost SM clock (MHz).
    """

    hbm_bytes_s: float
    bf16_flops: float
    fp8_flops: float
    memory_bytes: float
    tdp_w: float
    idle_w: float
    link_bytes_s: float
    max_clock_mhz: float


GPU_SPECS: dict[str, GpuSpec] = {
    GpuType.H100: GpuSpec(3.35e12, 989e12, 1979e12, 80e9, 700.0, 75.0, 450e9, SM_CLOCK_RANGE_MHZ[GpuType.H100][1]),
    GpuType.A100: GpuSpec(2.0e12, 312e12, 0.0, 80e9, 400.0, 55.0, 300e9, SM_CLOCK_RANGE_MHZ[GpuType.A100][1]),
}
#: largest size CV the lognormal fit from (mean, p90) returns
_MAX_SIZE_CV = 1.5


@dataclass(frozen=True)
class Priors:
    """Efficiency priors of the roofline, all ``modeled`` until observations correct them.

    decode_roofline_ratio : measured TPOT / bandwidth roofline at small batch (REFERENCES: ~2.2).
    prefill_compute_eff : achieved share of peak FLOP/s in prefill (Vidur: ~0.77 for 4k tokens; 0.6 kept).
    mem_clock_sensitivity : fraction of a memory-bound step that scales with 1/clock (decode barely slows).
    allreduce_latency_s : per all-reduce fixed latency with TP > 1 (s); two per layer.
    step_overhead_s : scheduler/launch overhead per prefill (s); in decode the roofline ratio covers it.
    kv_memory_share : share of HBM usable for weights + KV (vLLM gpu_memory_utilization 0.9).
    load_bytes_s : weight-loading bandwidth for a cold start or precision reload (B/s per replica).
    load_fixed_s : container/engine start time on top of weight loading (s).
    power_clock_exponent : dynamic power ~ (clock / max)^exponent.
    decode_activity, prefill_activity : share of dynamic power drawn while decoding / prefilling (0-1).
    chunk_tokens : prefill tokens per iteration (vLLM max_num_batched_tokens, the serving config; tokens); None:
        the engine's default for the pool's GPU type unless the plan sets it (`chunk_tokens_of`).
    node_idle_w : idle power of one 8-GPU server per GPU type (W; Splitwise, REFERENCES.md): the node's
        non-GPU overhead is this minus eight idle GPUs, drawn by every node that hosts a live replica.
    """

    decode_roofline_ratio: float = 2.2
    prefill_compute_eff: float = 0.6
    mem_clock_sensitivity: float = 0.1
    allreduce_latency_s: float = 12e-6
    step_overhead_s: float = 1.0e-3
    kv_memory_share: float = 0.9
    load_bytes_s: float = 2.0e9
    load_fixed_s: float = 30.0
    power_clock_exponent: float = 2.0
    decode_activity: float = 0.35
    prefill_activity: float = 0.9
    chunk_tokens: int | None = None
    node_idle_w: dict[str, float] = field(default_factory=lambda: {"H100": 2800.0, "A100": 1500.0})
    provenance: Provenance = Provenance.MODELED


@dataclass(frozen=True)
class Corrections:
    """Multiplicative correction factors fitted from observations (1.0 = the prior).

    decode, prefill : observed / predicted step time per (gpu, model, precision) (a 2-tuple (gpu, model) key
        applies to every precision of the pair); power : observed / predicted dynamic (above idle) GPU power
        per gpu; step_cv : coefficient of variation of step time across nodes and requests (from residuals).
    precision_credit : share (0-1, in log terms) of the roofline's precision gain (fp8: half the weight and KV
        bytes, twice the peak FLOP/s) credited to a precision never observed on its (gpu, model): 1 trusts the
        roofline, 0 assumes no gain over the observed precision. An observed precision uses its own factor.
    tpot_tail : per request class, the learned shape of per-request TPOT: ((quantile level 0-1, TPOT / the
        replica's median TPOT), ...) from completions (empty = the parametric tail only).
    """

    decode: dict[tuple[str, ...], float] = field(default_factory=dict)
    prefill: dict[tuple[str, ...], float] = field(default_factory=dict)
    power: dict[str, float] = field(default_factory=dict)
    step_cv: float = 0.10
    precision_credit: float = 1.0
    tpot_tail: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def pessimistic(self) -> Corrections:
        """The same factors crediting no gain to an unobserved precision (the risk scenarios)."""
        return replace(self, precision_credit=0.0)


@dataclass(frozen=True)
class PoolConfig:
    """What the serving model needs of a pool: gpu type, model, tp (GPUs/replica), weight precision, clock (MHz),
    and the KV-cache dtype (vLLM's, "auto" = the activation dtype bf16: `schemas.fleet.kv_storage`), which sets
    the KV capacity and the KV bytes a decode step reads."""

    gpu: str
    model: str
    tp: int
    precision: str
    sm_clock_mhz: float
    kv_dtype: str = "auto"


class ServingModel:
    """Roofline step times, KV capacity, load time and GPU power for a pool configuration.

    Parameters
    ----------
    priors : efficiency priors (modeled).
    corrections : observed/predicted factors from self-calibration (default: none).

    Examples
    --------
    >>> sm = ServingModel()
    >>> cfg = PoolConfig("H100", "llama-3.1-8b", 1, "bf16", 1980)
    >>> round(sm.decode_step_s(cfg, batch=8, context_tokens=1500) * 1e3, 1)  # ms per token, bs 8
    11.6
    """

    def __init__(self, priors: Priors | None = None, corrections: Corrections | None = None) -> None:
        self.priors = priors or Priors()
        self.corrections = corrections or Corrections()
        # _factor per (table, gpu, model, precision): a pure function of the corrections, which are fixed for
        # the instance (with_corrections makes a new one); the forward model asks it millions of times a replay
        self._factors: dict[tuple[int, str, str, str], float] = {}
        self._decode_terms: dict[PoolConfig, tuple[float, ...]] = {}

    def with_corrections(self, corrections: Corrections) -> ServingModel:
        """A copy using other correction factors (the priors are kept)."""
        return ServingModel(self.priors, corrections)

    def _clock_ratio(self, cfg: PoolConfig) -> float:
        return max(cfg.sm_clock_mhz, 1.0) / GPU_SPECS[cfg.gpu].max_clock_mhz

    @staticmethod
    def _prefill_clock_ratio(cfg: PoolConfig) -> float:
        """Compute-bound prefill's clock against the priors' (ratio): prefill runs at the power-limited clock
        (schemas.fleet.power_limited_clock_mhz, measured), so a locked clock above it changes nothing and one
        below it slows prefill by f_pl / f."""
        f_pl = power_limited_clock_mhz(cfg.gpu)
        return min(max(cfg.sm_clock_mhz, 1.0), f_pl) / f_pl

    def _peak_flops(self, cfg: PoolConfig) -> float:
        g = GPU_SPECS[cfg.gpu]
        return g.fp8_flops if cfg.precision == "fp8" and g.fp8_flops > 0 else g.bf16_flops

    def _comm_s(self, cfg: PoolConfig, tokens: float) -> float:
        if cfg.tp <= 1:
            return 0.0
        m = MODELS[cfg.model]
        g = GPU_SPECS[cfg.gpu]
        ring = 2.0 * (cfg.tp - 1) / cfg.tp * tokens * m.hidden * 2.0 / g.link_bytes_s
        return 2 * m.layers * (self.priors.allreduce_latency_s + ring)

    def decode_step_s(self, cfg: PoolConfig, batch: float, context_tokens: float) -> float:
        """Time of one decode iteration (s) = TPOT of every sequence in it.

        Parameters
        ----------
        cfg : pool configuration.
        batch : concurrent sequences in the iteration (count, >= 1).
        context_tokens : mean tokens already in each sequence's KV cache (tokens).
        """
        c = self._decode_terms.get(cfg)
        if c is None:
            c = self._decode_terms[cfg] = self._decode_terms_of(cfg)
        weights_b, kv_b, tp, hbm, roofline, mem_clock, two_params, layers, hidden, flop_s, factor = c
        b = max(batch, 1.0)
        bytes_moved = (weights_b + b * context_tokens * kv_b) / tp
        mem_s = bytes_moved / hbm * roofline
        mem_s *= mem_clock
        flops = two_params * b / tp + 4.0 * b * context_tokens * layers * hidden / tp
        cmp_s = flops / flop_s
        step = max(mem_s, cmp_s) + self._comm_s(cfg, b)
        return step * factor

    def _decode_terms_of(self, cfg: PoolConfig) -> tuple[float, ...]:
        """decode_step_s's per-configuration terms, in the order it combines them (its figures are the same to
        the last bit): weight bytes, KV bytes per token (B), tp, HBM (B/s), roofline ratio, the memory clock
        factor, 2 x params, layers, hidden, the compute rate (FLOP/s), the correction factor."""
        g, m, p = GPU_SPECS[cfg.gpu], MODELS[cfg.model], self.priors
        clock = self._clock_ratio(cfg)
        return (m.params * BYTES_PER_VALUE[cfg.precision], m.kv_bytes_per_token(_kv(cfg)), cfg.tp,
                g.hbm_bytes_s, p.decode_roofline_ratio, 1.0 + p.mem_clock_sensitivity * (1.0 / clock - 1.0),
                2.0 * m.params, m.layers, m.hidden, self._peak_flops(cfg) * clock * p.prefill_compute_eff,
                self._factor(self.corrections.decode, cfg, _decode_gain))  # fmt: skip

    def prefill_s(self, cfg: PoolConfig, tokens: float) -> float:
        """Time to prefill `tokens` new prompt tokens of one request (s), compute-bound.

        Parameters
        ----------
        cfg : pool configuration.
        tokens : uncached prompt tokens (tokens).
        """
        g, m, p = GPU_SPECS[cfg.gpu], MODELS[cfg.model], self.priors
        n = max(tokens, 1.0)
        flops = (2.0 * m.params * n + 2.0 * n * n * m.layers * m.hidden) / cfg.tp
        cmp_s = flops / (self._peak_flops(cfg) * self._prefill_clock_ratio(cfg) * p.prefill_compute_eff)
        mem_s = m.params * BYTES_PER_VALUE[cfg.precision] / cfg.tp / g.hbm_bytes_s
        step = max(cmp_s, mem_s) + self._comm_s(cfg, n) + p.step_overhead_s
        return step * self._factor(self.corrections.prefill, cfg, _prefill_gain)

    def _factor(self, table: dict[tuple[str, ...], float], cfg: PoolConfig, gain: GainFn) -> float:
        """Correction of a step time for `cfg` (ratio): its own precision's fitted factor when observed;
        else another observed precision's factor moved by the uncredited part of the roofline's precision gain
        (gain ratio^(1 - precision_credit)); else the (gpu, model) factor, or 1, from bf16 the same way."""
        key = (id(table), cfg.gpu, cfg.model, cfg.precision)
        if key not in self._factors:
            self._factors[key] = self._factor_of(table, cfg, gain)
        return self._factors[key]

    def _factor_of(self, table: dict[tuple[str, ...], float], cfg: PoolConfig, gain: GainFn) -> float:
        own = table.get((cfg.gpu, cfg.model, cfg.precision))
        if own is not None:
            return own
        keep = 1.0 - min(max(self.corrections.precision_credit, 0.0), 1.0)
        seen = sorted((k[2], v) for k, v in table.items() if len(k) == 3 and k[:2] == (cfg.gpu, cfg.model))
        base, ref = (seen[0][1], seen[0][0]) if seen else (table.get((cfg.gpu, cfg.model), 1.0), "bf16")
        if keep == 0.0 or ref == cfg.precision:
            return base
        return base * (gain(cfg.gpu, cfg.precision) / gain(cfg.gpu, ref)) ** keep

    def kv_capacity_tokens(self, cfg: PoolConfig) -> float:
        """KV-cache capacity of one replica (tokens) after weights, at the usable HBM share."""
        g, m = GPU_SPECS[cfg.gpu], MODELS[cfg.model]
        bpp = BYTES_PER_VALUE[cfg.precision]
        free = g.memory_bytes * cfg.tp * self.priors.kv_memory_share - m.params * bpp
        return max(free, 0.0) / m.kv_bytes_per_token(_kv(cfg))

    def load_s(self, cfg: PoolConfig) -> float:
        """Cold start or precision reload time of one replica (s)."""
        m = MODELS[cfg.model]
        return self.priors.load_fixed_s + m.params * BYTES_PER_VALUE[cfg.precision] / self.priors.load_bytes_s

    def gpu_power_w(self, gpu: str, sm_clock_mhz: float, activity: float) -> float:
        """Board power of one GPU (W): idle + activity x clock-scaled dynamic part x fitted factor, <= TDP.

        Parameters
        ----------
        gpu : GPU type.
        sm_clock_mhz : SM clock (MHz).
        activity : share of the dynamic range in use (0-1); :meth:`activity` maps load to it.
        """
        g = GPU_SPECS[gpu]
        dyn = self.dynamic_power_w(gpu, sm_clock_mhz, activity) * self.corrections.power.get(gpu, 1.0)
        return min(g.idle_w + dyn, g.tdp_w)

    def dynamic_power_w(self, gpu: str, sm_clock_mhz: float, activity: float) -> float:
        """Uncorrected power above idle of one GPU (W) at an activity (0-1) and SM clock (MHz)."""
        g = GPU_SPECS[gpu]
        clock = min(max(sm_clock_mhz, 1.0) / g.max_clock_mhz, 1.0)
        return (g.tdp_w - g.idle_w) * min(max(activity, 0.0), 1.0) * clock**self.priors.power_clock_exponent

    def idle_power_w(self, gpu: str) -> float:
        """Idle board power of one GPU (W, datasheet)."""
        return GPU_SPECS[gpu].idle_w

    def node_overhead_w(self, gpu: str) -> float:
        """Non-GPU power of one powered 8-GPU node (W): server idle power - 8 idle GPUs (modeled)."""
        return max(self.priors.node_idle_w.get(gpu, 0.0) - 8.0 * GPU_SPECS[gpu].idle_w, 0.0)

    def activity(self, busy: float, prefill_share: float, batch: float, max_batch: float) -> float:
        """Dynamic-power activity (0-1) of a replica busy `busy` of the time, prefilling `prefill_share`.

        Parameters
        ----------
        busy : share of wall time with work in flight (0-1).
        prefill_share : share of busy time spent in prefill (0-1).
        batch, max_batch : mean and maximum concurrent sequences (count); larger decode batches draw more.
        """
        p = self.priors
        dec = p.decode_activity * (0.6 + 0.4 * min(batch / max(max_batch, 1.0), 1.0))
        return min(max(busy, 0.0), 1.0) * (prefill_share * p.prefill_activity + (1.0 - prefill_share) * dec)

    def activity_from_util(self, gpu_util_pct: float) -> float:
        """Activity implied by DCGM_FI_DEV_GPU_UTIL (% 0-100), for fitting power against telemetry."""
        return min(max(gpu_util_pct, 0.0), 100.0) / 100.0 * self.priors.decode_activity


GainFn = Callable[[str, str], float]


def _kv(cfg: PoolConfig) -> str:
    """The dtype `cfg`'s KV cache is stored in ('bf16' | 'fp8')."""
    return str(kv_storage(cfg.kv_dtype))


def _decode_gain(gpu: str, precision: str) -> float:
    """Roofline decode speed-up of a precision over bf16 (ratio): bytes per weight and KV value. Beside a bf16 KV
    cache (vLLM's "auto") fp8 weights gain less (the KV bytes stay), so an uncredited share of this gain takes back
    a little more than that roofline gave: an unobserved fp8 with the default cache is predicted conservatively."""
    return BYTES_PER_VALUE["bf16"] / BYTES_PER_VALUE[precision]


def _prefill_gain(gpu: str, precision: str) -> float:
    """Roofline prefill speed-up of a precision over bf16 (ratio): peak dense FLOP/s."""
    g = GPU_SPECS[gpu]
    return g.fp8_flops / g.bf16_flops if precision == "fp8" and g.fp8_flops > 0 else 1.0


def clock_or_max(gpu: str, sm_clock_mhz: float | None) -> float:
    """The SM clock (MHz), defaulting to the GPU's boost clock."""
    return float(sm_clock_mhz) if sm_clock_mhz else GPU_SPECS[gpu].max_clock_mhz


#: gamma shape k -> p90 / mean, on the branch where it falls with k (k >= 0.2032, where it peaks at 3.02)
_GAMMA_K = np.exp(np.linspace(math.log(0.2033), math.log(400.0), 400))
_GAMMA_P90_RATIO = special.gammaincinv(_GAMMA_K, 0.9) / _GAMMA_K


def prompt_cv_from_p90(mean: float, p90: float) -> float:
    """CV of a gamma with this mean and 90th percentile (0 when p90 <= mean; at most 1/sqrt(0.2033)).

    Prompt sizes: on the protocol traces (chat, code) the lognormal through (mean, p90) puts the 99th percentile
    at 1.9x the trace's (chat 7,991 vs 4,141 tokens) and its CV at the 1.5 cap (true 0.96); the gamma gives
    5,552 and 1.04."""
    if mean <= 0.0 or p90 <= mean:
        return 0.0
    k = float(np.interp(p90 / mean, _GAMMA_P90_RATIO[::-1], _GAMMA_K[::-1]))
    return 1.0 / math.sqrt(k)


def gamma_exceed(mean: float, cv: float, threshold: float) -> float:
    """P(X > threshold) for a gamma X with the given mean and coefficient of variation (0-1)."""
    if mean <= 0.0:
        return 0.0
    if threshold <= 0.0:
        return 1.0
    if cv <= 0.0:
        return 1.0 if threshold < mean else 0.0
    k = 1.0 / (cv * cv)
    return float(special.gammaincc(k, threshold * k / mean))


def size_cv_from_p90(mean: float, p90: float) -> float:
    """CV of a lognormal with this mean and 90th percentile (0 when p90 <= mean): output lengths."""
    if mean <= 0.0 or p90 <= mean:
        return 0.0
    # p90/mean = exp(1.2816 s - s^2/2); solve for s on the increasing branch
    r = math.log(p90 / mean)
    s = 1.2816 - math.sqrt(max(1.2816**2 - 2.0 * r, 0.0))
    return min(math.sqrt(math.expm1(s * s)), _MAX_SIZE_CV)
