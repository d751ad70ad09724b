"""The report page and its figure files.

`build(out)` writes OUT/report/report.html (one file: the Vega, Vega-Lite and vega-embed JavaScript inlined from
the vl-convert package, so it opens offline with no CDN) and OUT/report/figures/<market>-<figure>.png and .svg
(rendered by vl-convert, no browser). The charts are drawn by vega-embed in the browser as SVG.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert as vlc
from altair.utils._importers import vl_version_for_vl_convert

from streams.report import charts
from streams.report.data import MarketData, ReportData, load

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1300px;
       color: #222; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
.meta { color: #666; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border-bottom: 1px solid #eee; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(610px, 1fr)); gap: 12px 24px; }
figure { margin: 0; } figcaption { color: #555; font-size: 12px; max-width: 600px; }
.note { color: #8a6d3b; font-size: 13px; }
"""


@dataclass(frozen=True)
class Figure:
    market: str
    stem: str
    caption: str
    spec: dict[str, Any]

    @property
    def element_id(self) -> str:
        return "fig-" + re.sub(r"[^A-Za-z0-9_-]", "_", f"{self.market}-{self.stem}")


def figures(data: ReportData) -> list[Figure]:
    """Every figure the data supports, market by market, in page order."""
    out = []
    for m in data.markets:
        for stem, caption, builder in charts.FIGURES:
            chart = builder(m)
            if chart is not None:
                out.append(Figure(m.key, stem, caption, chart.to_dict()))
    return out


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _headline(m: MarketData) -> str:
    by = {(r["policy"], r["basis"]): r for r in m.policies}
    names = list(dict.fromkeys(r["policy"] for r in m.policies))
    rows = []
    for p in names:
        r, o = by.get((p, "rented"), {}), by.get((p, "owned"), {})
        rng = (f"{_fmt(r.get('gp_per_dollar_min'), '.1f')} .. {_fmt(r.get('gp_per_dollar_max'), '.1f')}"
               if r.get("seeds", 1) > 1 else "")
        cells = [p, _fmt(r.get("gp_per_dollar"), ".1f"), rng, _fmt(o.get("gp_per_dollar"), ".1f"),
                 _fmt(r.get("cost_usd"), ",.2f"), _fmt(o.get("cost_usd"), ",.2f"),
                 _fmt(r.get("sla_violation_rate"), ".2%"), _fmt(r.get("energy_share"), ".1%")]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = ["policy", "gp/$ rented", "seed range", "gp/$ owned", "cost $ rented", "cost $ owned", "violations",
            "energy share"]
    table = ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
             + "".join(rows) + "</tbody></table>")
    if m.headroom is not None:
        table += (f"<p>Hindsight headroom: the hindsight arm's gp/$ is {m.headroom:.2%} above aurelius's "
                  "(what perfect knowledge of the window would add).</p>")
    chk = m.hindsight_check
    if chk is not None and not chk.get("valid", True):
        table += (f"<p class='note'>The hindsight arm is not an upper bound here: beaten by "
                  f"{html.escape(', '.join(map(str, chk.get('beaten_by', []))))} in seeds "
                  f"{html.escape(', '.join(map(str, chk.get('invalid_seeds', []))))}.</p>")
    fb = [d for d in m.decisions if d["fallback"]]
    if m.decisions:
        table += (f"<p class='meta'>{len(m.decisions)} audited decisions, {len(fb)} fallbacks "
                  f"({len(fb) / len(m.decisions):.0%}).</p>")
    return table


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/")


def render_html(data: ReportData, figs: list[Figure]) -> str:
    """The whole page as one string: styles, the inlined Vega JS bundle, tables and one vega-embed per figure."""
    bundle = vlc.javascript_bundle(vl_version=vl_version_for_vl_convert()).replace("</script", "<\\/script")
    cfg = data.results.get("config", {})
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>Aurelius replay report</title>",
        f"<style>{STYLE}</style>",
        f"<script type='text/javascript'>{bundle}</script>",
        "</head><body>",
        "<h1>Aurelius replay report</h1>",
        f"<p class='meta'>{html.escape(str(data.out))} &middot; policies {html.escape(str(cfg.get('policies', '')))}"
        f" &middot; seeds {html.escape(str(cfg.get('seeds', '')))} &middot; period "
        f"{data.period_s / 60:g} min &middot; headline basis {html.escape(str(cfg.get('cost_basis', 'rented')))}</p>",
    ]
    for note in data.missing:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    for m in data.markets:
        w = m.window
        parts.append(f"<h2>{html.escape(m.key)}</h2>")
        parts.append(
            f"<p class='meta'>window {html.escape(str(w.get('start', '')))} .. {html.escape(str(w.get('end', '')))}"
            f" &middot; mean price {_fmt(w.get('mean_price_usd_mwh'), '.1f')} $/MWh &middot; rule "
            f"{html.escape(str(w.get('rule', '')))}</p>"
        )
        parts.append(_headline(m))
        parts.append("<div class='grid'>")
        for f in (f for f in figs if f.market == m.key):
            parts.append(f"<figure><div id='{f.element_id}' class='chart' data-figure='{f.stem}'></div>"
                         f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
        parts.append("</div>")
    specs = {f.element_id: f.spec for f in figs}
    parts.append(
        "<script type='text/javascript'>\n"
        f"const specs = {_script_json(specs)};\n"
        "window.aureliusRendered = 0;\n"
        "for (const [id, spec] of Object.entries(specs)) {\n"
        "  vegaEmbed('#' + id, spec, {renderer: 'svg', actions: false})\n"
        "    .then(() => { window.aureliusRendered += 1; document.getElementById(id).dataset.rendered = 'yes'; })\n"
        "    .catch((e) => { document.getElementById(id).textContent = 'chart error: ' + e; });\n"
        "}\n</script>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_figures(figs: list[Figure], directory: Path, svg: bool = True) -> list[Path]:
    """Each figure as PNG (and SVG), rendered by vl-convert."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for f in figs:
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", f"{f.market}-{f.stem}")
        png = directory / f"{stem}.png"
        png.write_bytes(vlc.vegalite_to_png(f.spec, scale=2, vl_version=vl_version_for_vl_convert()))
        written.append(png)
        if svg:
            path = directory / f"{stem}.svg"
            path.write_text(vlc.vegalite_to_svg(f.spec, vl_version=vl_version_for_vl_convert()))
            written.append(path)
    return written


def build(out: str | Path, dest: str | Path | None = None, png: bool = True) -> Path:
    """Write the report of replay output `out` under `dest` (default OUT/report); return the HTML path."""
    data = load(out)
    dest = Path(dest) if dest else Path(out) / "report"
    dest.mkdir(parents=True, exist_ok=True)
    alt.data_transformers.disable_max_rows()
    figs = figures(data)
    page = dest / "report.html"
    page.write_text(render_html(data, figs))
    if png:
        write_figures(figs, dest / "figures")
    return page
