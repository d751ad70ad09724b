"""Bundled-data loaders: each source quirk, the normalized shape, traces, ServeGen shape, `aurelius data`."""

from __future__ import annotations

import gzip
import logging
import shutil
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl
import pytest

from schemas.fleet import MARKETS
from streams.cli import main
from streams.datasets import paths
from streams.datasets.prices import PRICE_SCHEMA, _read_file, load_prices, price_gaps
from streams.datasets.servegen import aligned_rate, load_rate_shape, shape_clients
from streams.datasets.traces import load_azure, load_mooncake


def test_data_dir_default_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    assert (paths.data_dir() / "prices" / "SOURCE.md").is_file()
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path))
    assert paths.data_dir() == tmp_path


@pytest.mark.parametrize("market", MARKETS)
def test_normalized_shape(market):
    df = load_prices(market, [2023])
    assert dict(df.schema) == PRICE_SCHEMA
    assert df["interval_start"].is_sorted() and df["interval_start"].n_unique() == df.height
    assert (df["interval_end"] - df["interval_start"]).unique().to_list() == [timedelta(hours=1)]
    assert df["lmp_usd_mwh"].null_count() == 0


@pytest.mark.parametrize(
    ("year", "hours"), [(2020, 8784), (2021, 8760), (2022, 8760), (2023, 8760), (2024, 8784)]
)
def test_caiso_year_is_its_local_calendar_year(year, hours):
    df = load_prices("CAISO", [year])
    assert df.height == hours
    local = df["interval_start"].dt.convert_time_zone("America/Los_Angeles")
    assert local.dt.year().unique().to_list() == [year]


def test_caiso_overlap_checked_and_deduped():
    root = paths.data_dir()
    a, b = _read_file(root, "CAISO", 2022), _read_file(root, "CAISO", 2023)
    overlap = a.join(b, on="interval_start", suffix="_next")
    assert overlap.height == 24  # the files overlap by one day
    assert (overlap["lmp_usd_mwh"] == overlap["lmp_usd_mwh_next"]).all()
    both = load_prices("CAISO", [2022, 2023])
    assert both.height == 8760 * 2
    assert both["interval_start"].n_unique() == both.height
    assert price_gaps(both).height == 0


def test_caiso_overlap_disagreement_raises(tmp_path, monkeypatch):
    src = paths.data_dir() / "prices" / "US-CAL-CISO"
    dst = tmp_path / "prices" / "US-CAL-CISO"
    dst.mkdir(parents=True)
    shutil.copy(src / "US-CAL-CISO_electricity_prices_2022.csv.gz", dst)
    lines = gzip.open(src / "US-CAL-CISO_electricity_prices_2023.csv.gz", "rt").read().splitlines()
    stamp = lines[1].split(",")[0]  # first row of 2023 = a row of the 24-h overlap with 2022
    lines[1] = f"{stamp},12345.0"
    with gzip.open(dst / "US-CAL-CISO_electricity_prices_2023.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path))
    with pytest.raises(ValueError, match="disagree"):
        load_prices("CAISO", [2022, 2023])


def test_ercot_offsets_parse_to_utc():
    df = load_prices("ERCOT", [2023])
    assert df.height == 8760
    # file row "2023-01-01 00:00:00-06:00" (CST) and "2023-07-10 00:00:00-05:00" (CDT)
    assert df["interval_start"][0] == datetime(2023, 1, 1, 6, tzinfo=UTC)
    assert df.filter(pl.col("interval_start") == datetime(2023, 7, 10, 5, tzinfo=UTC)).height == 1
    local = df["interval_start"].dt.convert_time_zone("America/Chicago")
    per_day = df.with_columns(local.dt.date().alias("d")).group_by("d").len()
    day = dict(per_day.iter_rows())
    assert day[datetime(2023, 11, 5).date()] == 25  # fall back: both 01:00 hours, distinct in UTC
    assert day[datetime(2023, 3, 12).date()] == 23  # spring forward


def test_pjm_and_caiso_naive_timestamps_are_utc():
    assert load_prices("PJM", [2023])["interval_start"][0] == datetime(2023, 1, 1, 5, tzinfo=UTC)
    assert load_prices("CAISO", [2023])["interval_start"][0] == datetime(2023, 1, 1, 8, tzinfo=UTC)


def test_pjm_dec31_gap_reported_not_filled(caplog):
    with caplog.at_level(logging.WARNING, logger="streams.datasets.prices"):
        df = load_prices("PJM", [2022, 2023])
    gaps = price_gaps(df)
    assert gaps.to_dicts() == [
        {"gap_start": datetime(2022, 12, 31, 5, tzinfo=UTC), "gap_end": datetime(2023, 1, 1, 5, tzinfo=UTC),
         "missing_hours": 24},
        {"gap_start": datetime(2023, 12, 31, 5, tzinfo=UTC), "gap_end": datetime(2024, 1, 1, 5, tzinfo=UTC),
         "missing_hours": 24},
    ]
    assert df.height == 8736 * 2  # nothing filled
    local = pl.col("interval_start").dt.convert_time_zone("America/New_York")
    assert df.filter((local.dt.month() == 12) & (local.dt.day() == 31)).height == 0
    assert "gap" in caplog.text


def test_price_gaps_inside_series():
    df = load_prices("ERCOT", [2023])
    holed = df.filter(~pl.col("interval_start").is_between(datetime(2023, 5, 1, 10, tzinfo=UTC),
                                                           datetime(2023, 5, 1, 12, tzinfo=UTC)))
    gaps = price_gaps(holed)
    assert gaps.rows() == [(datetime(2023, 5, 1, 10, tzinfo=UTC), datetime(2023, 5, 1, 13, tzinfo=UTC), 3)]


def test_unknown_market_and_year():
    with pytest.raises(ValueError):
        load_prices("NYISO", [2023])
    with pytest.raises(FileNotFoundError):
        load_prices("PJM", [2019])


def test_loader_returns_independent_frames():
    a = load_prices("PJM", [2023])
    a.drop_in_place("lmp_usd_mwh")
    assert "lmp_usd_mwh" in load_prices("PJM", [2023]).columns


def test_traces():
    code, conv = load_azure("code"), load_azure("conv")
    assert (code.height, conv.height) == (8819, 19366)
    assert code["arrived_at"].is_sorted() and conv["arrived_at"].is_sorted()
    assert code.row(0) == (datetime(2023, 11, 16, 18, 17, 3, 979960, tzinfo=UTC), 4808, 10)
    mc = load_mooncake()
    assert mc.height == 12031 and mc["arrival_ms"].is_sorted()
    assert mc["prefix_block_ids"][0].to_list() == list(range(14))
    assert mc.row(0)[1:3] == (6758, 500)


def test_servegen_shape():
    shape = load_rate_shape()
    assert shape.height == 2016 and shape_clients() == 162
    assert shape["offset_s"][1] == 600
    assert shape["rate_rps"].mean() == pytest.approx(195.844, abs=1e-3)


def test_shape_aligned_to_local_hour_and_weekday():
    rate = load_rate_shape()["rate_rps"].to_numpy()
    # the shape's clock is UTC+8 with t=0 a Monday midnight: Asia/Shanghai reproduces it at window centres
    monday = datetime(2023, 7, 10, tzinfo=ZoneInfo("Asia/Shanghai"))
    got = aligned_rate("Asia/Shanghai", monday, np.arange(2016) * 600.0 + 300.0)
    week = int(((datetime(2023, 7, 10) - datetime(2018, 1, 1)).days // 7) % 2)
    assert np.allclose(got, np.roll(rate, -1008 * week))
    # a market's Wednesday 14:05 local maps to the shape's Wednesday 14:05 slot, in summer and winter
    for tz, day in (("America/New_York", datetime(2023, 7, 12)), ("America/Chicago", datetime(2023, 1, 11))):
        local = day.replace(hour=14, minute=5, tzinfo=ZoneInfo(tz))
        slot = 2 * 144 + 14 * 6 + ((day - datetime(2018, 1, 1)).days // 7) % 2 * 1008
        assert aligned_rate(tz, local, np.array([0.0]))[0] == pytest.approx(rate[slot])


def test_data_list_cli(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("prices/PJM", "prices/ERCOT", "prices/CAISO", "azure_llm_2023 code", "mooncake_fast25",
                 "servegen", "CC-BY-4.0", "Apache-2.0", "MIT", "120 h missing"):
        assert name in out
