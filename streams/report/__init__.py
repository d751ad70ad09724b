"""`aurelius report OUT`: one self-contained HTML page (Vega-Lite through altair, the Vega JS inlined) and PNG/SVG
figures from a replay's results.json, replay.duckdb and Parquet audit log.

Modules: data (loading the three sources into small frames), charts (one altair chart per figure), page (the
HTML assembly and the figure files), cli (the command).
"""
