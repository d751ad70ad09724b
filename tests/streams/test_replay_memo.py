"""The replay's on-disk cache of its preparation (streams/replay/memo.py): a repeated week-before search is loaded,
equal to the one measured; a new source digest, `--no-cache` or an unreadable entry measure again."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from optimizer.baselines.tuned import StaticConfig
from schemas.fleet import default_fleet
from streams.cli import build_parser
from streams.replay import cli, memo, tuning
from tests.streams.test_tuning_search import _fake, _score

START = datetime(2023, 7, 27, 18, tzinfo=UTC)
JOB = cli.Job("PJM", "PJM", False, 2023, 0, ("production-tuned",))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(memo.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["replay", "--markets", "PJM", "--tune-draws", "1", *extra])


def test_a_tuning_survives_the_round_trip_equal() -> None:
    t = tuning.Tuning(StaticConfig("fp8", "fp8", None, 0.85, 0.7, 2048), START,
                      ({"config": StaticConfig().as_dict(), "gp_per_dollar": 0.1 + 0.2, "violation": {"chat": 1 / 3},
                        "sla_met": 12345, "gpu_usd": 9.87654321},),
                      tuning.ClockPrices((tuning.ClockMeasurement(0.7, 950.5, 1.0, 1.2, 0.0006, False),
                                          tuning.ClockMeasurement(1.0, 960.0, 1.0, 1.2, 0.0008, True,
                                                                  ((480.0, 0.5, 0.6, 0.0004),) * 2))))
    bare = tuning.Tuning(StaticConfig(), START, ())  # no clock measured
    for x in (t, bare):
        assert memo.load_tuning(json.loads(json.dumps(memo.dump_tuning(x)))) == x


def test_a_repeated_search_is_loaded_and_equal(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _fake(monkeypatch, _score)
    first = cli._tune(JOB, _args(), START)
    measured = len(runs)
    assert measured > 10 and len(list(cache.glob("tune-*.json"))) == 1
    again = cli._tune(JOB, _args(), START)
    assert again == first and len(runs) == measured  # nothing served again
    cli._tune(JOB, _args("--no-cache"), START)
    assert len(runs) == 2 * measured
    cli._tune(JOB, _args("--tune-draws", "2"), START)  # other inputs: another entry
    assert len(list(cache.glob("tune-*.json"))) == 2


def test_an_edit_to_the_sources_makes_a_new_key(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _fake(monkeypatch, _score)
    cli._tune(JOB, _args(), START)
    measured = len(runs)
    monkeypatch.setattr(memo, "source_digest", lambda: "an edited tree")
    cli._tune(JOB, _args(), START)
    assert len(runs) == 2 * measured


def test_an_unreadable_entry_is_measured_again(cache: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[tuple[str, str, str], int]:
        calls.append(1)
        return {("s", "m", "H100"): 3}

    name = memo.key("lead", market="PJM")
    assert memo.remembered(name, compute, memo.dump_fleet, memo.load_fleet) == {("s", "m", "H100"): 3}
    (cache / f"{name}.json").write_text('[["s", "m"')  # cut short
    assert memo.remembered(name, compute, memo.dump_fleet, memo.load_fleet) == {("s", "m", "H100"): 3}
    assert memo.remembered(name, compute, memo.dump_fleet, memo.load_fleet) == {("s", "m", "H100"): 3}
    assert len(calls) == 2


def test_the_cache_is_off_for_the_suite_and_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memo.cache_dir() is None  # tests/conftest.py
    monkeypatch.delenv(memo.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert memo.cache_dir() == Path("/x/aurelius/replay")
    assert default_fleet(("PJM",)) == default_fleet(("PJM",))  # the key's inputs compare by value
