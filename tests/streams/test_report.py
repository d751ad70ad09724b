"""`aurelius report`: the page and figures from a tiny synthesized replay output, and the page opened in a real
headless Chromium (offline: every host name resolves to nothing) with every chart rendered by vega-embed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
import pytest

from sinks.audit_store import ParquetAuditStore
from streams.cli import build_parser, main
from streams.report import charts
from streams.report.data import load
from streams.report.page import build, figures

START = datetime(2023, 7, 1, 12, 0, tzinfo=UTC)
POLICIES = ("production", "aurelius", "hindsight")
CLASSES = ("code", "chat", "batch")


def _plan(floor: int, label: str) -> dict:
    return {"label": label, "batch_admission": "pressure", "autoscale": True, "autoscale_target": 0.8, "pools": [
        {"site": "site-pjm", "model": "llama-3.1-70b", "gpu": "H100", "replica_floor": floor,
         "replica_ceiling": 16, "tp": 4, "precision": "bf16", "kv_dtype": "auto", "max_batch": 256,
         "sm_clock_mhz": 1980}]}


def _summary(gp: float, seed: int) -> dict:
    return {"seed": seed, "gp_per_dollar": gp, "gp_per_dollar_owned": gp / 2, "cost_usd": 100.0 + seed,
            "cost_usd_owned": 200.0, "energy_share": 0.12, "energy_share_owned": 0.06, "sla_violation_rate": 0.01,
            "classes": {c: {"sla_violation_rate": 0.01 * (i + 1)} for i, c in enumerate(CLASSES)}}


def make_replay_output(out: Path, audit: bool = True, db: bool = True) -> Path:
    """results.json (3 policies x 2 seeds), replay.duckdb (periods, requests) and an audit log of 4 decisions."""
    out.mkdir(parents=True, exist_ok=True)
    pol = {}
    for k, p in enumerate(POLICIES):
        seeds = [_summary(300.0 + 20 * k + s, s) for s in (0, 1)]
        agg = {key: sum(s[key] for s in seeds) / 2 for key in seeds[0] if isinstance(seeds[0][key], float)}
        agg["classes"] = seeds[0]["classes"]
        agg["gp_per_dollar_min"], agg["gp_per_dollar_max"] = 300.0 + 20 * k, 301.0 + 20 * k
        agg["by_seed"] = seeds
        pol[p] = agg
    results = {"schema_version": "1", "config": {"period_minutes": 5.0, "policies": ",".join(POLICIES),
                                                 "seeds": "0,1", "cost_basis": "rented"},
               "markets": {"PJM": {"window": {"start": START.isoformat(), "end": (START + timedelta(minutes=15))
                                              .isoformat(), "mean_price_usd_mwh": 80.0, "rule": "max"},
                                   "policies": pol,
                                   "hindsight": {"valid": False, "invalid_seeds": [1], "beaten_by": ["oracle"]}}}}
    (out / "results.json").write_text(json.dumps(results))
    if db:
        rows, reqs = [], []
        for p in POLICIES:
            for s in (0, 1):
                for k in range(6):
                    rows.append({"market": "PJM", "policy": p, "seed": s, "period": k,
                                 "period_start": START + timedelta(minutes=5 * k), "arrivals": 30 if k < 3 else 0,
                                 "sla_met": 29.0, "it_energy_kwh": 1.0, "gpus_mean": 20.0 - k,
                                 "price_usd_mwh": 70.0 + 5 * k})
                    if k < 3:
                        reqs += [{"market": "PJM", "policy": p, "seed": s, "request_class": c,
                                  "arrival_s": 300.0 * k + i} for i, c in enumerate(CLASSES * 10)]
        con = duckdb.connect(str(out / "replay.duckdb"))
        for name, frame in (("periods", pl.DataFrame(rows)), ("requests", pl.DataFrame(reqs))):
            con.register("frame", frame.to_arrow())
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM frame")
            con.unregister("frame")
        con.close()
    if audit:
        store = ParquetAuditStore(out / "audit")
        for k in range(4):
            at = (START + timedelta(minutes=5 * k)).strftime("%Y-%m-%dT%H:%M:%SZ")
            fb = k in (0, 2)
            store.add({"decision_id": f"d{k}", "policy": "aurelius", "markets": ["PJM"], "period_index": k,
                       "period_start": at, "as_of": at, "seed": 0, "fallback": fb,
                       "fallback_reason": ("start: no fleet observation yet" if k == 0 else
                                           "pareto: gp/$ 1 <= reference 1 x 1.03") if fb else None,
                       "chosen_plan": _plan(8 if fb else 6, "chosen"), "reference_plan": _plan(8, "production"),
                       "predicted_delta": {"cost_usd": 0.0 if fb else -1.5}, "regret": 0.0,
                       "realized": {"regret": 0.02 * k} if k else None})
        store.flush()
    return out


def test_report_page_and_figures_from_a_replay_output(tmp_path):
    out = make_replay_output(tmp_path / "out")
    page = build(out)
    text = page.read_text()
    # one self-contained file: no script or stylesheet loaded from anywhere, the Vega bundle inlined
    assert not re.search(r"<script[^>]*\bsrc=", text) and "<link" not in text
    assert "vegaEmbed" in text and len(text) > 300_000
    figs = figures(load(out))
    stems = {f.stem for f in figs}
    assert stems == {stem for stem, _, _ in charts.FIGURES}  # every figure, regret included (realized present)
    for f in figs:
        png = page.parent / "figures" / f"PJM-{f.stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert (page.parent / "figures" / f"PJM-{f.stem}.svg").read_text().lstrip().startswith("<svg")
    assert "Hindsight headroom" in text and "4 audited decisions, 2 fallbacks" in text
    assert "not an upper bound here: beaten by oracle in seeds 1" in text


def test_report_rows_are_what_the_sources_say(tmp_path):
    data = load(make_replay_output(tmp_path / "out"))
    m = data.markets[0]
    assert [r["phase"] for r in m.periods if r["policy"] == "aurelius"] == ["window"] * 3 + ["drain"] * 3
    assert {(r["period"], r["request_class"]): r["arrivals"] for r in m.arrivals}[(0, "chat")] == 10
    gp = {(r["policy"], r["basis"]): r for r in m.policies}
    assert gp[("aurelius", "rented")]["gp_per_dollar_max"] == 321.0 and gp[("aurelius", "owned")]["seeds"] == 2
    assert [d["chosen_gpus"] for d in m.decisions] == [32.0, 24.0, 32.0, 24.0]
    assert [d["reason_kind"] for d in m.decisions] == ["start", "", "pareto", ""]
    assert [d["realized_regret"] for d in m.decisions] == [None, 0.02, 0.04, 0.06]
    hind, aur = 340.5, 320.5  # mean gp/$ of the two seeds
    assert m.headroom == pytest.approx((hind - aur) / hind)


def test_report_says_what_is_missing(tmp_path):
    out = make_replay_output(tmp_path / "out", audit=False, db=False)
    text = build(out, png=False).read_text()
    assert "replay.duckdb not found" in text and "no Parquet audit log" in text
    assert {f.stem for f in figures(load(out))} == {"gp_per_dollar", "cost", "violations", "energy_share"}


def test_report_cli(tmp_path, capsys):
    out = make_replay_output(tmp_path / "out")
    assert main(["report", str(out), "--no-figures", "--dest", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.html").is_file() and not (tmp_path / "r" / "figures").exists()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "results.json" in capsys.readouterr().err
    assert build_parser().parse_args(["replay", "--report"]).report is True


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


def test_report_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium binary: .ci/run installs the OS package `chromium`")
        pytest.skip("no chromium binary found (apt-get install chromium); the browser check is skipped")
    out = make_replay_output(tmp_path / "out")
    page = build(out, png=False)
    n = len(figures(load(out)))
    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000",
           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    # every chart embedded and drawn as SVG marks by vega-embed, none failed
    assert dom.count('data-rendered="yes"') == n, dom[-2000:]
    assert len(re.findall(r'<svg[^>]*class="marks"', dom)) == n
    assert dom.count('role-mark') >= n
    shot = tmp_path / "report.png"
    subprocess.run([*cmd[:-2], "--window-size=1320,1600", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:4] == b"\x89PNG"
