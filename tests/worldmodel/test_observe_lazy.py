"""Observation frames are built when a policy reads them: identical to frames built at the period close."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from polars.testing import assert_frame_equal

from optimizer.registry import create
from schemas.fleet import default_fleet
from schemas.policy import Observations
from streams.replay.driver import run_replay
from streams.workload.builder import build_workload
from tests.worldmodel.test_groundtruth import Recording
from worldmodel.groundtruth.observe import LazyObservations

FRAMES = ("arrivals", "completions", "telemetry", "fleet_events", "prices")


@pytest.fixture(scope="module")
def runs():  # noqa: ANN201
    wl = build_workload("PJM", 2023, periods=3, seed=0)
    fleet = default_fleet(("PJM",))
    eager = run_replay(wl, create("production"), fleet, keep_observations=True)  # read at each period close
    keeping = Recording(create("production"))  # every Observations kept unread until the run is over
    run_replay(wl, keeping, fleet)
    return eager, keeping.seen


def test_frames_read_after_the_run_equal_frames_read_at_the_close(runs) -> None:
    eager, seen = runs
    assert seen and all(isinstance(o, LazyObservations) for o in seen)
    for name in FRAMES:
        for k, obs in enumerate(seen):
            if name == "prices":  # the driver keeps no price frames; check they are read once, consistently
                assert_frame_equal(getattr(obs, name), getattr(obs, name))
                continue
            assert_frame_equal(getattr(obs, name), eager.observations[name][k])
    assert sum(o.completions.height for o in seen) > 0 and sum(o.telemetry.height for o in seen) > 0


def test_lazy_observations_pickle_and_replace_as_plain_observations(runs) -> None:
    _, seen = runs
    obs = seen[1]
    back = pickle.loads(pickle.dumps(obs))
    assert type(back) is Observations
    for name in FRAMES:
        assert_frame_equal(getattr(back, name), getattr(obs, name))
    later = replace(obs, period_index=99)
    assert later.period_index == 99
    assert_frame_equal(later.telemetry, obs.telemetry)
