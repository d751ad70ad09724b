"""The worked example of an operator's history: a record directory generated from the bundled data by another
fleet, policy and physics than the defaults, with the generating factors kept apart.

`generate_history(out)` writes `out/history/<kind>.parquet` (arrivals, completions, telemetry, fleet_events,
prices: the layout `aurelius replay --emit-observations` writes) and `out/truth.json` beside it (the hidden
coefficient factors, fleet, policy and window the records were generated under; a calibration must not read
it). The operator's fleet is 4 H100 nodes at one site, serving with the production-class reference under an
HPA target of 0.65 and the 8B model in fp8 weights, on a ground truth whose step-time and power coefficients
are scaled by `HIDDEN_FACTORS`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from optimizer.baselines.production import ProductionPolicy
from schemas.fleet import MARKET_REGION, NODE_PEAK_W, POWER_CAP_SHARE, FleetSpec, GpuType, NodeGroup, Site
from schemas.plan import Plan
from schemas.policy import History, Observations, Policy, PolicyContext
from schemas.protocol import PROTOCOL_V1
from streams.replay.cli import emit_observations
from streams.replay.driver import run_replay
from streams.workload.builder import build_workload
from worldmodel.groundtruth.runtime import CoefficientCorrections, Physics

#: The generating factors on the cited coefficients (every pool), hidden from the calibration.
HIDDEN_FACTORS = CoefficientCorrections(
    prefill_scale=1.18, decode_scale=1.12, idle_power_scale=0.88, active_power_scale=0.85
)
#: Requests a 3-hour window would carry at the example's volume (the protocol scales the rate shape to it);
#: about a quarter of the protocol's 500k, for a fleet of 32 H100s instead of 64 H100s and 64 A100s.
EXAMPLE_REQUESTS_PER_3H = 120_000


@dataclass(frozen=True)
class ExampleSpec:
    """What the example history is generated under.

    market : the bundled market whose price window and rate shape are used; periods : 5-minute control periods
    of arrivals; seed : workload seed; h100_nodes : 8-GPU H100 nodes at the one site; target : the autoscaler's
    HPA target; fp8_model : the model served in fp8 weights; factors : the hidden coefficient factors;
    requests_per_3h : volume the rate shape is scaled to (requests per 3 h).
    """

    market: str = "ERCOT"
    periods: int = 12
    seed: int = 0
    h100_nodes: int = 4
    target: float = 0.65
    fp8_model: str = "llama-3.1-8b"
    factors: CoefficientCorrections = HIDDEN_FACTORS
    requests_per_3h: int = EXAMPLE_REQUESTS_PER_3H


class Fp8ModelPolicy(Policy):
    """Another policy's plans with one model's pools served in fp8 weights (bf16 KV cache)."""

    def __init__(self, inner: Policy, model: str) -> None:
        self.inner = inner
        self.model = model
        self.name = f"{inner.name}-fp8-{model}"

    def _fp8(self, plan: Plan) -> Plan:
        pools = tuple(replace(p, precision="fp8") if p.model == self.model else p for p in plan.pools)
        return replace(plan, pools=pools)

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return self._fp8(self.inner.start(ctx, history))

    def plan(self, obs: Observations) -> Plan:
        return self._fp8(self.inner.plan(obs))


def example_fleet(market: str, h100_nodes: int) -> FleetSpec:
    """One site of `h100_nodes` H100 nodes (racks of 4), its IT power cap at the default share of its peak (W)."""
    group = NodeGroup(GpuType.H100, h100_nodes, max(1, h100_nodes // 4))
    site = Site(
        name=f"site-{market.lower()}",
        market=market,
        groups=(group,),
        power_cap_w=POWER_CAP_SHARE * NODE_PEAK_W[GpuType.H100] * h100_nodes,
        region=MARKET_REGION[market],
    )
    return FleetSpec(sites=(site,))


def generate_history(out: Path, spec: ExampleSpec | None = None) -> Path:
    """Replay the bundled workload under `spec` and write its records; return the history directory.

    Writes out/history/<kind>.parquet and out/truth.json (the generating factors and setup, not part of the
    history). Deterministic in `spec`.
    """
    spec = spec or ExampleSpec()
    protocol = replace(PROTOCOL_V1, target_requests=spec.requests_per_3h)
    workload = build_workload(spec.market, periods=spec.periods, seed=spec.seed, protocol=protocol)
    fleet = example_fleet(spec.market, spec.h100_nodes)
    policy = Fp8ModelPolicy(ProductionPolicy(target=spec.target), spec.fp8_model)
    physics = Physics(corrections=(spec.factors,))
    res = run_replay(
        workload, policy, fleet, window_s=spec.periods * protocol.period_s, physics=physics, keep_observations=True
    )
    history = Path(out) / "history"
    emit_observations(history, res)
    truth = {
        "note": "generating setup of the worked example; hidden from the calibration",
        "factors": asdict(spec.factors),
        "spec": {k: v for k, v in asdict(spec).items() if k != "factors"},
        "fleet": [{"site": s.name, "groups": [[str(g.gpu), g.nodes] for g in s.groups]} for s in fleet.sites],
        "policy": policy.name,
        "window_start": workload.window.start.isoformat(),
        "requests": workload.requests.height,
    }
    (Path(out) / "truth.json").write_text(json.dumps(truth, indent=2))
    return history
