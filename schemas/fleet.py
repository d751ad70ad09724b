"""Fleet inventory: what an operator knows about its own sites (not the ground truth's hidden effects)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from schemas.provenance import Provenance, Tagged


class GpuType(StrEnum):
    H100 = "H100"
    A100 = "A100"


class Precision(StrEnum):
    """Weight (and activation) precision of a replica."""

    BF16 = "bf16"
    FP8 = "fp8"


class KvCacheDtype(StrEnum):
    """KV-cache dtype, as vLLM's `--kv-cache-dtype` names it: "auto" keeps the activation dtype (bf16)."""

    AUTO = "auto"
    FP8 = "fp8"


GPU_INDEX: dict[GpuType, int] = {GpuType.H100: 0, GpuType.A100: 1}
PRECISION_INDEX: dict[Precision, int] = {Precision.BF16: 0, Precision.FP8: 1}
GPUS_PER_NODE = 8
#: KV-cache dtypes each weight precision may run with (vLLM allows an fp8 KV cache on Hopper).
KV_DTYPES_BY_PRECISION: dict[Precision, tuple[KvCacheDtype, ...]] = {
    Precision.BF16: (KvCacheDtype.AUTO,),
    Precision.FP8: (KvCacheDtype.AUTO, KvCacheDtype.FP8),
}


def kv_dtype_for(precision: str, kv_dtype: str) -> str:
    """`kv_dtype` where weights in `precision` run with it, else "auto" (the engine's default: the weights'
    dtype): a plan that switches weights keeps a KV dtype the engine accepts.

    >>> kv_dtype_for("fp8", "fp8"), kv_dtype_for("bf16", "fp8"), kv_dtype_for("bf16", "auto")
    ('fp8', 'auto', 'auto')
    """
    return kv_dtype if kv_dtype_offered(precision, kv_dtype) else str(KvCacheDtype.AUTO)


def kv_storage(kv_dtype: str = "auto") -> Precision:
    """The dtype vLLM stores the KV cache in for `kv_dtype` ('auto' keeps the activation dtype, bf16, whatever the
    weights; 'fp8'): the one rule the ground truth's physics and the planner's serving model both follow.
    ValueError for an unknown dtype. Which pairs with weights a plan may choose is `kv_dtype_offered`'s question
    (the policy gate's): the models predict whatever a fleet reports (vLLM also runs an fp8 cache beside bf16
    weights).

    >>> kv_storage("fp8"), kv_storage("auto")
    (<Precision.FP8: 'fp8'>, <Precision.BF16: 'bf16'>)
    """
    return Precision.FP8 if kv_cache_dtype(kv_dtype) == KvCacheDtype.FP8 else Precision.BF16


def kv_cache_dtype(value: str) -> KvCacheDtype:
    """`value` as a KvCacheDtype; ValueError naming the known ones for anything else.

    >>> kv_cache_dtype("int8")
    Traceback (most recent call last):
    ...
    ValueError: unknown KV-cache dtype 'int8'; expected one of ['auto', 'fp8']
    """
    try:
        return KvCacheDtype(value)
    except ValueError as exc:
        known = [k.value for k in KvCacheDtype]
        raise ValueError(f"unknown KV-cache dtype {value!r}; expected one of {known}") from exc


def kv_dtype_offered(precision: str, kv_dtype: str) -> bool:
    """Whether plans may run weights in `precision` with `kv_dtype` (`KV_DTYPES_BY_PRECISION`).

    >>> kv_dtype_offered("fp8", "fp8"), kv_dtype_offered("bf16", "fp8"), kv_dtype_offered("bf16", "int8")
    (True, False, False)
    """
    return kv_dtype in KV_DTYPES_BY_PRECISION[Precision(precision)]


#: SM clock range per GPU type (MHz); max is the default boost clock.
SM_CLOCK_RANGE_MHZ: dict[GpuType, tuple[int, int]] = {GpuType.H100: (1095, 1980), GpuType.A100: (1005, 1410)}

#: Clock a busy GPU holds in compute-bound (prefill) work under its default power limit (MHz). Measured on the
#: project's H200: bf16 prefill of 8k tokens held 1,579 MHz (1,515-1,665) of its 1,980 MHz maximum at 693 W of
#: its 700 W limit, clock-event reason 0x4 = SW power cap (fp8 prefill: 1,739 MHz at 694 W).
POWER_LIMITED_CLOCK_MHZ: dict[GpuType, Tagged] = {
    GpuType.H100: Tagged(
        1579.0,
        "MHz",
        Provenance.MODELED,
        "measured H200 bf16 prefill clock (benchmarks/results/gpu_calibration_h200.json) transferred to H100 SXM: "
        "same die, SM count, 1,980 MHz maximum and 700 W limit; under equal caps H100 does slightly better than "
        "H200 on compute-bound DGEMM (arXiv 2604.11391), so this is at most slightly low",
    ),
    GpuType.A100: Tagged(
        round(1410.0 * 1579.0 / 1980.0),
        "MHz",
        Provenance.MODELED,
        "the H200's measured power-limited share of its maximum clock (1,579 / 1,980 = 0.80) applied to the "
        "A100's 1,410 MHz; Splitwise A100 runs with prefill reach 0.98-1.09 x TDP peak power (REFERENCES.md), "
        "i.e. A100 prefill is at its power limit too; no measured A100 clock",
    ),
}

#: FP8 tensor cores exist on Hopper only.
PRECISIONS_BY_GPU: dict[GpuType, tuple[Precision, ...]] = {
    GpuType.H100: (Precision.BF16, Precision.FP8),
    GpuType.A100: (Precision.BF16,),
}

#: vLLM V1 engine batch shape per GPU type for the OpenAI API server (`vllm serve`): max_num_batched_tokens
#: (the chunked-prefill token budget of one iteration) and max_num_seqs (sequences per replica). vLLM picks
#: them from the device: >= 70 GiB of memory and not an A100 (H100, H200, MI300x) 8192 / 1024, otherwise
#: 2048 / 256 (a large token budget lowered A100 throughput, vLLM PR #17885). The as-deployed engine runs
#: these; the ground truth's token budget and the production-class references' batch cap read them here.
VLLM_BATCH_DEFAULTS_SOURCE = (
    "vllm-project/vllm vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER "
    "(commit 99d7eb5d, v0.11 line)"
)
VLLM_MAX_NUM_BATCHED_TOKENS: dict[GpuType, Tagged] = {
    GpuType.H100: Tagged(8192.0, "tokens", Provenance.MODELED, f"{VLLM_BATCH_DEFAULTS_SOURCE}: >= 70 GiB, not A100"),
    GpuType.A100: Tagged(2048.0, "tokens", Provenance.MODELED, f"{VLLM_BATCH_DEFAULTS_SOURCE}: A100 branch"),
}
VLLM_MAX_NUM_SEQS: dict[GpuType, Tagged] = {
    GpuType.H100: Tagged(1024.0, "sequences", Provenance.MODELED, f"{VLLM_BATCH_DEFAULTS_SOURCE}: >= 70 GiB, not A100"),
    GpuType.A100: Tagged(256.0, "sequences", Provenance.MODELED, f"{VLLM_BATCH_DEFAULTS_SOURCE}: A100 branch"),
}


def default_max_num_batched_tokens(gpu: str) -> int:
    """vLLM V1's default max_num_batched_tokens on `gpu` (tokens per iteration): the as-deployed token budget.

    >>> default_max_num_batched_tokens("H100"), default_max_num_batched_tokens("A100")
    (8192, 2048)
    """
    return int(VLLM_MAX_NUM_BATCHED_TOKENS[GpuType(gpu)].value)


def default_max_num_seqs(gpu: str) -> int:
    """vLLM V1's default max_num_seqs on `gpu` (sequences per replica): the as-deployed batch cap.

    >>> default_max_num_seqs("H100"), default_max_num_seqs("A100")
    (1024, 256)
    """
    return int(VLLM_MAX_NUM_SEQS[GpuType(gpu)].value)


@dataclass(frozen=True)
class NodeGroup:
    """Identical 8-GPU nodes of one type at one site, spread over racks."""

    gpu: GpuType
    nodes: int
    racks: int


@dataclass(frozen=True)
class Site:
    """One site (one per market). power_cap_w is the site IT power cap (W) before PUE."""

    name: str
    market: str
    groups: tuple[NodeGroup, ...]
    power_cap_w: float
    region: str

    def gpus(self, gpu: GpuType) -> int:
        return sum(g.nodes * GPUS_PER_NODE for g in self.groups if g.gpu == gpu)


@dataclass(frozen=True)
class FleetSpec:
    """The fleet inventory; the default is one site per market (DESIGN.md, documented in README)."""

    sites: tuple[Site, ...] = field(default_factory=tuple)

    def site(self, market: str) -> Site:
        for s in self.sites:
            if s.market == market:
                return s
        raise KeyError(f"no site for market {market!r}")

    def inventory(self) -> dict[tuple[str, str], int]:
        """GPUs per (site name, gpu type) (count)."""
        return {(s.name, str(g.gpu)): s.gpus(g.gpu) for s in self.sites for g in s.groups}

    def gpus_by_type(self) -> dict[str, int]:
        """GPUs per gpu type over every site (count)."""
        return gpus_by_type(self.inventory())


def gpus_by_type(inventory: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """GPUs per gpu type of an inventory keyed (site name, gpu type), summed over its sites (count).

    >>> gpus_by_type({("pjm-1", "H100"): 64, ("pjm-1", "A100"): 32, ("ercot-1", "H100"): 64})
    {'H100': 128, 'A100': 32}
    """
    out: dict[str, int] = {}
    for (_, gpu), n in inventory.items():
        out[gpu] = out.get(gpu, 0) + n
    return out


#: Tensor parallelism per model (GPUs per replica) by GPU type.
DEFAULT_TP: dict[tuple[str, GpuType], int] = {
    ("llama-3.1-8b", GpuType.H100): 1,
    ("llama-3.1-8b", GpuType.A100): 1,
    ("llama-3.1-70b", GpuType.H100): 4,
    ("llama-3.1-70b", GpuType.A100): 8,
}


#: Peak draw of one 8-GPU node at full load and maximum clock (W): 8 x GPU TDP (H100 SXM 700 W, A100 SXM
#: 400 W) plus the non-GPU node power implied by Splitwise's idle servers (REFERENCES.md); modeled. It is what
#: the ground truth's power model draws at full load (tests/worldmodel/test_physics.py pins the two together),
#: not the 10.2 kW / 6.5 kW DGX provisioning ratings, which no node of the model reaches.
NODE_PEAK_W: dict[GpuType, float] = {  # 8 GPUs in power-limited prefill (idle + 0.99 x (limit - idle)) + non-GPU
    GpuType.H100: 8 * (129.0 + 0.99 * (700.0 - 129.0)) + (2_800.0 - 8 * 129.0),
    GpuType.A100: 8 * (73.7 + 0.99 * (400.0 - 73.7)) + (1_500.0 - 8 * 73.7),
}
#: Site power cap as a share of the whole fleet's peak: binds at maximum clock with every GPU busy.
POWER_CAP_SHARE = 0.85
MARKET_REGION: dict[str, str] = {"PJM": "us-east", "ERCOT": "us-central", "CAISO": "us-west"}
#: the bundled markets, in the order replays and data builds run them
MARKETS: tuple[str, ...] = tuple(MARKET_REGION)


def default_site(market: str, h100_nodes: int = 8, a100_nodes: int = 8) -> Site:
    """The default site of one market: H100 and A100 nodes of 8 GPUs in racks of 4 nodes, a binding cap."""
    groups = (
        NodeGroup(GpuType.H100, h100_nodes, max(1, h100_nodes // 4)),
        NodeGroup(GpuType.A100, a100_nodes, max(1, a100_nodes // 4)),
    )
    peak = sum(NODE_PEAK_W[g.gpu] * g.nodes for g in groups)
    return Site(
        name=f"site-{market.lower()}",
        market=market,
        groups=groups,
        power_cap_w=POWER_CAP_SHARE * peak,
        region=MARKET_REGION[market],
    )


def default_fleet(markets: tuple[str, ...] = MARKETS) -> FleetSpec:
    """One default site per market (README documents the layout)."""
    return FleetSpec(sites=tuple(default_site(m) for m in markets))


#: The ground truth's decode power fits (worldmodel.physics.power.DECODE_POWER_FITS): "record" (the ruler's) and
#: "h100-measured" (a sensitivity: the H100's intercept fitted to its measured decode power; `--decode-power-fit`).
DECODE_POWER_FIT_NAMES: tuple[str, ...] = ("record", "h100-measured")


def power_limited_clock_mhz(gpu: str) -> float:
    """The clock (MHz) a busy GPU holds in compute-bound work under its default power limit (the ground truth's
    prefill clock; the planner's serving model reads the same figure).

    >>> power_limited_clock_mhz("H100")
    1579.0
    """
    return POWER_LIMITED_CLOCK_MHZ[GpuType(gpu)].value
