"""What a policy is told about the fleet: a market's single-site replay shows it that site alone, whatever other
markets the job replays (the owned basis charges every GPU of the fleet the policy is given, so another market's
inventory would change its decisions); the three-site mode shows every site."""

from __future__ import annotations

from optimizer.registry import create
from schemas.fleet import default_fleet
from schemas.policy import PolicyContext
from streams.replay.driver import run_replay
from streams.workload.builder import build_workload


class _Seen:
    """production, remembering the context it was started with."""

    name = "production"

    def __init__(self) -> None:
        self.inner = create("production")
        self.ctx: PolicyContext | None = None

    def start(self, ctx, history):  # noqa: ANN001, ANN201
        self.ctx = ctx
        return self.inner.start(ctx, history)

    def plan(self, obs):  # noqa: ANN001, ANN201
        return self.inner.plan(obs)

    def last_decision(self):  # noqa: ANN201
        return None


def _ctx(all_sites: bool) -> PolicyContext:
    wl = build_workload("ERCOT", 2023, periods=1, seed=0)
    seen = _Seen()
    run_replay(wl, seen, default_fleet(), window_s=300.0, grace_s=0.0, all_sites=all_sites)  # type: ignore[arg-type]
    assert seen.ctx is not None
    return seen.ctx


def test_a_single_site_replay_shows_the_policy_its_site_alone() -> None:
    ctx = _ctx(all_sites=False)
    assert [s.name for s in ctx.fleet.sites] == ["site-ercot"] and ctx.markets == ("ERCOT",)
    assert ctx.fleet.gpus_by_type() == default_fleet(("ERCOT",)).gpus_by_type()


def test_the_three_site_replay_shows_every_site() -> None:
    ctx = _ctx(all_sites=True)
    assert sorted(s.name for s in ctx.fleet.sites) == sorted(s.name for s in default_fleet().sites)
