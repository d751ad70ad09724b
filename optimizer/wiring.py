"""The policy factory: `build_policy(name, workload, seed)` gives reference policies via
`optimizer.registry.create` and the aurelius arms with their real adapters injected (`optimizer.world_adapter`,
`optimizer.forecast_adapter`), production-tuned at the week-before tuning (else production) as the Pareto
reference and fallback.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from optimizer.aurelius import AURELIUS_ARMS, AureliusPolicy
from optimizer.baselines.tuned import StaticConfig
from optimizer.clock_price import ClockPrices
from optimizer.forecast_adapter import ForecastingProvider, OracleForecastProvider
from optimizer.registry import create
from optimizer.scale_guard import GUARD_TARGET_ON_PRODUCTION, GUARD_TARGET_THREE_SITE, ScaleGuard
from optimizer.world_adapter import WorldStateModel
from schemas.policy import Policy
from worldmodel.state import WorldState

#: The Pareto reference of the aurelius arms without a week-before tuning (the Kafka worker, `aurelius-own-precision`)
#: and of the arms that fix an engine setting of their own: production's plan. Measured on the default windows, 3
#: seeds (benchmarks/results/ruler21_default_2023_seeds012_refs_aurelius_r4margins_a5454c0.json), taking the
#: better-predicted of production and production-tuned as the yardstick let the weaker reference's plan in
#: (predicted better, realized worse), so one plan is the yardstick.
DEFAULT_REFERENCE = "production"
#: The reference of the aurelius arms once the week before has been measured: production-tuned at that tuning's
#: configuration (batch cap, autoscaler target and its price rule for deferrable work included), the strongest
#: reference on every default window since the search measured the engine settings. The guard over it was chosen
#: on the week before and on 2022's windows, where it beat the guard over production's plan at the tuned engine
#: settings (`benchmarks/guard_fit.py --engine tuned-policy` against `--engine tuned`; on 2022's windows the
#: latter left chat violations 3-4 pp above production-tuned's at every setting). It first broke the batch class's
#: deadlines on the default windows: the forward model then priced a held backlog at size 0 after arrivals stop
#: (worldmodel/demand.py), so the planner released the fleet under it (docs/optimizer.md "The guard over
#: production-tuned's plan"). On the rented basis only: on the owned basis, where the whole fleet is paid for until the
#: drain ends, its price rule's hold lengthens the drain, and production is the strongest owned reference in PJM and
#: CAISO (889.7 against 1399.6 owned gp/$ in PJM); guarding its plan there made 931.0 / 505.1 / 912.7 owned against
#: 1534.4 / 567.9 / 1328.6 over production's (`default_2023_seeds012_refs_aurelius_owned_on_tuned_e2c31a7.json`), and
#: the owned guard's target was fitted over production's plan.
TUNED_REFERENCE = "production-tuned"
#: Further references run beside it, each period the best-predicted reference plan being the Pareto yardstick
#: (none by default; `also_references=("production-tuned",)` restores the two-reference yardstick).
DEFAULT_ALSO_REFERENCES: tuple[str, ...] = ()


def wants_tuning(name: str) -> bool:
    """Whether policy `name` reads the week-before tuning (`build_policy`'s `tuned`): production-tuned, and the
    aurelius arms that take its precision.

    >>> wants_tuning("production-tuned"), wants_tuning("aurelius"), wants_tuning("production")
    (True, True, False)
    """
    return name == "production-tuned" or (name in AURELIUS_ARMS and "reference_precision" not in AURELIUS_ARMS[name])


def build_policy(
    name: str,
    workload: Any = None,
    seed: int = 0,
    reference: str | None = None,
    period_s: float = 300.0,
    window_periods: int | None = None,
    world_state: WorldState | None = None,
    tuned: StaticConfig | None = None,
    clock: ClockPrices | None = None,
    cost_basis: str = "rented",
    all_sites: bool = False,
    **kwargs: Any,
) -> Policy:
    """A ready-to-run policy by name: references via the registry, aurelius arms with the real adapters.

    Parameters
    ----------
    name : a registered reference ("production", "production-tuned", "naive") or an aurelius arm
        (`AURELIUS_ARMS`).
    workload : the replay's `Workload`; needed only by `oracle` (its realized future).
    seed : workload seed, recorded with each decision.
    reference : the Pareto reference of the aurelius arms; None: the arm's own (`aurelius-on-production`:
        production), else `TUNED_REFERENCE` at `tuned` where given and the arm fixes no engine setting of its own,
        else `DEFAULT_REFERENCE` (on the owned basis too). Over production's plan at the tuned engine settings the
        guard runs the target fitted over that plan (`GUARD_TARGET_ON_PRODUCTION`). The `DEFAULT_ALSO_REFERENCES` run
        beside it unless `also_references` is given.
    period_s : control period (s), for the oracle's realized series.
    window_periods : periods that receive arrivals (`aurelius replay --periods`; None: the whole window).
    world_state : the Kafka worker's state, which the aurelius arms then read instead of keeping their own
        (`WorldStateModel(shared=...)`); None in the embedded replay.
    tuned : the static configuration measured best on the week before the window (streams/replay/tuning.py):
        production-tuned runs it; the aurelius arms take its weights and KV dtype as the reference's
        (`reference_precision`) unless the arm fixes its own. None: production-tuned chooses with the forward
        model, the arms keep the reference's precision.
    clock : the same tuning's SM clock-share measurements (optimizer/clock_price.py): the aurelius arms that take
        the tuning's precision run the reference's plan at the share they price best (`reference_clock`) unless
        the arm fixes its own.
    cost_basis : the operator's cost basis, "rented" or "owned" (schemas/cost.py): what the aurelius arms
        optimize (`AureliusPolicy.cost_basis`); the references do not depend on it.
    all_sites : the three-site mode (one shared workload, every site serving, `aurelius replay --sites three`):
        over production-tuned's plan the guard runs the target fitted on that mode's week before
        (`GUARD_TARGET_THREE_SITE`).
    kwargs : further `AureliusPolicy` settings (e.g. audit=False).
    """
    if name not in AURELIUS_ARMS:
        return create(name, config=tuned) if name == "production-tuned" else create(name)
    arm = dict(AURELIUS_ARMS[name])
    if tuned is not None and wants_tuning(name):
        kwargs.setdefault("reference_precision", (tuned.precision, tuned.kv_dtype))
        if "reference_token_budget" not in arm:
            kwargs.setdefault("reference_token_budget", tuned.max_num_batched_tokens)
    if clock is not None and wants_tuning(name) and "reference_clock" not in arm:
        kwargs.setdefault("reference_clock", clock)
    fixed = arm.pop("reference", None)  # an arm that names its reference (`aurelius-on-production`)
    if reference is None:
        # arms that fix an engine setting of their own ablate it on production's plan, as they were measured; the
        # owned basis guards production's plan too (`TUNED_REFERENCE`: its hold lengthens the drain it pays for)
        own_engine = {"reference_precision", "reference_clock", "reference_token_budget"} & arm.keys()
        tuned_ref = tuned is not None and wants_tuning(name) and not own_engine and cost_basis == "rented"
        reference = fixed or (TUNED_REFERENCE if tuned_ref else DEFAULT_REFERENCE)
    if reference == TUNED_REFERENCE and tuned is not None:  # at the measured configuration, as the reference runs
        kwargs.setdefault("reference_policy", build_policy(reference, tuned=tuned))
    guard = kwargs.get("guard", arm.get("guard", ScaleGuard()))
    if reference != TUNED_REFERENCE and tuned is not None and wants_tuning(name) and guard is not None:
        kwargs["guard"] = replace(guard, rented_target=GUARD_TARGET_ON_PRODUCTION.value)
    elif all_sites and reference == TUNED_REFERENCE and guard is not None:
        kwargs["guard"] = replace(guard, rented_target=GUARD_TARGET_THREE_SITE.value)
    horizon = int(kwargs.get("horizon_periods", arm.get("horizon_periods", 12)))
    if arm.get("oracle"):
        if workload is None:
            raise ValueError("the oracle arm needs the workload (its realized future)")
        provider: ForecastingProvider = OracleForecastProvider(workload, period_s, horizon, window_periods)
    else:
        provider = ForecastingProvider(horizon, window_periods=window_periods)
    kwargs.setdefault("also_references", tuple(r for r in DEFAULT_ALSO_REFERENCES if r != reference))
    return AureliusPolicy(
        name=name,
        reference=reference,
        seed=seed,
        forecast_provider=provider,
        cost_basis=cost_basis,
        world_model=WorldStateModel(shared=world_state),
        **{**arm, **kwargs},
    )
