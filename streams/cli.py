"""The `aurelius` command line. Parsers only: each subcommand's work lives in its package and is imported
lazily, so `aurelius --help` answers without loading statsforecast, cvxpy, river or numba."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from schemas.cost import COST_BASES
from schemas.fleet import DECODE_POWER_FIT_NAMES, MARKETS
from schemas.kafka_client import EXIT_CONFIG, EXIT_UNAVAILABLE, KafkaSettingsError, KafkaUnavailable


def _window_flags(p: argparse.ArgumentParser) -> None:
    """The window flags shared by replay, worldmodel-validate, publish and data window."""
    p.add_argument("--markets", default=",".join(MARKETS), help="comma-separated markets (PJM,ERCOT,CAISO)")
    p.add_argument("--year", type=int, default=2023, help="price year the window is chosen in (default 2023)")
    p.add_argument("--years", default=None, help="comma-separated years to sweep (overrides --year)")
    p.add_argument("--start", default=None, help="window start, ISO 8601 UTC (overrides the window rule)")
    p.add_argument(
        "--window-rule",
        choices=("max", "median"),
        default="max",
        help="max: most expensive contiguous 3 h by mean price; median: a 3 h run whose mean is the year's median",
    )
    p.add_argument("--periods", type=int, default=None, help="control periods in the window (default: 3 h worth)")
    p.add_argument("--period-minutes", type=float, default=5.0, help="control period length (min)")
    p.add_argument(
        "--source",
        choices=("protocol", "azure", "mooncake"),
        default="protocol",
        help="protocol: the v1 mixed workload; azure|mooncake: replay one trace unchanged",
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed")


class _RefusePassword(argparse.Action):
    """`--sasl-password`: refused without echoing the value (a password on the command line shows in `ps`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error("--sasl-password is not accepted (it would show in the process list): set "
                     "$KAFKA_SASL_PASSWORD or use --sasl-password-file")


def _kafka_flags(p: argparse.ArgumentParser) -> None:
    """Broker address, transport security and start-up retry of every Kafka command (unset: env `KAFKA_*`;
    schemas/kafka_client.py). The SASL password has no flag (it would show in `ps`): $KAFKA_SASL_PASSWORD or
    --sasl-password-file."""
    p.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
        help="Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS, else localhost:9092)",
    )
    g = p.add_argument_group("Kafka security (each flag defaults to its env variable $KAFKA_<NAME>)")
    g.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
                   help="transport: PLAINTEXT (default), SSL (TLS), SASL_PLAINTEXT or SASL_SSL")
    g.add_argument("--sasl-mechanism", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                   help="SASL mechanism (SASL_* protocols)")
    g.add_argument("--sasl-username", help="SASL user (SASL_* protocols)")
    g.add_argument("--sasl-password-file", metavar="PATH",
                   help="file holding the SASL password (else $KAFKA_SASL_PASSWORD; no flag takes the password)")
    g.add_argument("--sasl-password", nargs="?", action=_RefusePassword, help=argparse.SUPPRESS)
    g.add_argument("--ssl-cafile", metavar="PATH", help="PEM CA bundle that signed the broker's certificate "
                   "(default: the system's CAs; SSL and SASL_SSL)")
    g.add_argument("--ssl-certfile", metavar="PATH", help="client certificate (PEM) for mutual TLS")
    g.add_argument("--ssl-keyfile", metavar="PATH", help="client key (PEM) for mutual TLS "
                   "(encrypted: $KAFKA_SSL_KEY_PASSWORD)")
    g.add_argument("--kafka-startup-timeout-s", dest="startup_timeout_s", type=float,
                   help="retry reaching the broker at start for this long, then exit 69 with one line (default 15)")


def _history_flags(p: argparse.ArgumentParser) -> None:
    """`replay` on an operator's own history instead of the bundled data (streams/history/run.py)."""
    p.add_argument("--history", default=None, metavar="DIR", help="replay a recorded history: a directory dump "
                   "(<kind>.parquet|.jsonl, or an --emit-observations output)")
    p.add_argument("--from-topics", default=None, metavar="BOOTSTRAP", help="replay the history in the input topics")
    p.add_argument("--history-config", default=None, metavar="FILE", help="classes, SLAs, inventory (TOML; "
                   "examples/history.toml)")
    p.add_argument("--history-start", default=None, help="replay range start, ISO 8601 UTC (earlier records: history)")
    p.add_argument("--history-end", default=None, help="replay range end, ISO 8601 UTC")
    p.add_argument("--history-topic-prefix", default="aurelius.", help="topic prefix with --from-topics")
    p.add_argument("--no-history-calibrate", dest="history_calibrate", action="store_false",
                   help="run the ground truth at its cited coefficients instead of the ones fitted to the records "
                        "(streams/calibration.py; the fit is reported either way)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="aurelius", description=__doc__.split("\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("replay", help="replay the benchmark window(s) for each policy; write results.json")
    _window_flags(p)
    p.add_argument("--policies", default="production,production-tuned,naive", help="comma-separated policies")
    p.add_argument("--seeds", default="0", help="comma-separated workload seeds")
    p.add_argument("--cost-basis", choices=COST_BASES, default="rented",
                   help="the operator's cost basis: the headline's, and what the aurelius arms optimize")
    p.add_argument(
        "--sites", choices=("one", "three"), default="one",
        help="one: a site per market; three: one shared workload served by a site in every market (residency)",
    )  # fmt: skip
    p.add_argument("--emit-observations", action="store_true", help="write the observation stream under OUT/")
    p.add_argument("--fp8-speedup-scale", type=float, default=1.0, help="sensitivity: scale the modeled FP8 gain")
    p.add_argument(
        "--decode-power-fit", choices=DECODE_POWER_FIT_NAMES, default="record",
        help="sensitivity: the decode power fit of the ground truth (record; h100-measured fits the H100's "
        "intercept to the fleet GPU's measured batch-64 decode power, docs/physics.md)",
    )  # fmt: skip
    p.add_argument(
        "--tune-draws", type=int, default=None,
        help="workload draws of the week before each configuration of the week-before search is measured on and "
        "pooled (default streams/replay/tuning.TUNE_DRAWS, 4; 1: the window's own week before alone, the protocol "
        "before 2026-12-03; benchmarks/tuning_noise.py)",
    )  # fmt: skip
    p.add_argument(
        "--scaler-trigger", choices=("v1", "legacy"), default="v1",
        help="autoscaler triggers: v1 (vLLM V1 waiting gauge, interactive backlog + deferrable deadline slack; "
        "the one of record) or legacy (the old backlog trigger, deferrable work included)",
    )  # fmt: skip
    p.add_argument(
        "--clock-power-exponent",
        type=float,
        default=None,
        help="sensitivity: override the modeled clock-power exponent",
    )
    p.add_argument(
        "--cold-start-s",
        type=float,
        default=None,
        help="sensitivity: every replica start and precision reload takes this many seconds "
        "(default: the cited per-model figure, worldmodel/physics/tables.py)",
    )
    p.add_argument("--out", default="out/replay", help="output directory")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes (one job = one market/seed workload under every policy)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-cache", action="store_true",
                   help="measure the week-before search and the lead-in fleet again instead of loading an earlier "
                   "run's (streams/replay/memo.py; off also with AURELIUS_CACHE_DIR=off)")  # fmt: skip
    p.add_argument("--report", action="store_true", help="then write the HTML report and figures under OUT/report")
    p.add_argument(
        "--hindsight", action="store_true",
        help="also run the hindsight arm (an oracle, not deployable: branches K plans per period on the ground "
        "truth and commits the best; the window's measured headroom); needs production among --policies",
    )  # fmt: skip
    p.add_argument("--hindsight-k", type=int, default=16, help="hindsight candidates per period (>= 16)")
    p.add_argument("--branch-h", type=int, default=2, help="continuation periods H of every branch")
    p.add_argument("--branch-replicates", type=int, default=None,
                   help="noise replicates every branch is averaged over, the realization left out (0: the realization "
                        "alone, ruler v2's branch; default "
                        "streams/replay/branching.DEFAULT_REPLICATES)")
    p.add_argument(
        "--realized-regret", default="", metavar="POLICIES",
        help="comma-separated policies whose decisions get realized regret on ground-truth branches (>= 30 "
        "decisions per window drawn by the seed; e.g. aurelius,production); needs production among --policies",
    )  # fmt: skip
    p.add_argument(
        "--regret-floor", action="store_true",
        help="with --realized-regret: also the regret each audited decision gets against null variants of its own "
        "plan (no real effect), the metric's noise floor at the same decisions and replicates",
    )  # fmt: skip
    _history_flags(p)
    p.set_defaults(_run="streams.replay.cli:run")

    p = sub.add_parser("report", help="HTML report (offline, one file) and PNG/SVG figures of a replay output")
    p.add_argument("out_dir", metavar="OUT", help="a replay's --out directory (results.json, replay.duckdb, audit/)")
    p.add_argument("--dest", default=None, help="directory for report.html and figures/ (default OUT/report)")
    p.add_argument("--no-figures", action="store_true", help="the HTML page only, no PNG/SVG files")
    p.set_defaults(_run="streams.report.cli:run")

    p = sub.add_parser("data", help="what is bundled, and what a window would contain")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="WHAT")
    d = dsub.add_parser("list", help="list bundled data sets with span, rows, license")
    d.set_defaults(_run="streams.data_cli:run_list")
    d = dsub.add_parser("window", help="show the window(s) a replay would use: span, mean price, requests per class")
    _window_flags(d)
    d.set_defaults(_run="streams.data_cli:run_window")

    p = sub.add_parser("forecast-eval", help="rolling-origin backtest of the forecasters")
    p.add_argument("--markets", default=",".join(MARKETS))
    p.add_argument("--years", default="2021,2022,2023,2024")
    p.add_argument("--horizon", type=int, default=24, help="steps ahead (hours for prices)")
    p.add_argument("--origins", type=int, default=None, help="rolling origins per series (default: all weeks)")
    p.add_argument("--out", default="out/forecast")
    p.set_defaults(_run="streams.forecast_eval_cli:run")

    p = sub.add_parser("worldmodel-validate", help="imposed-action test of the planner's forward model")
    _window_flags(p)
    p.add_argument("--out", default="out/validate")
    p.set_defaults(_run="streams.replay.validate_cli:run")

    p = sub.add_parser("worker", help="the faust worker: topics -> world model -> decisions -> audit topic")
    _kafka_flags(p)
    p.add_argument("--db", default="aurelius_state.duckdb", help="world-model DuckDB file")
    p.add_argument("--audit-dir", default="audit", help="Parquet audit log directory")
    p.add_argument("--market", default="PJM")
    p.add_argument("--policy", default="aurelius")
    p.add_argument("--cost-basis", choices=COST_BASES, default=None,
                   help="the operator's cost basis the policy optimizes (default rented)")
    p.add_argument("--topic-prefix", default="aurelius.", help="prefix of every topic name")
    p.add_argument("--field-map", default=None, help="TOML field mapping for foreign producers")
    p.add_argument("--period-s", type=float, default=None, help="control period length (s; default 300)")
    p.add_argument(
        "--allowed-lateness-s",
        type=float,
        default=None,
        help="watermark = max event time - this (s; default 30)",
    )
    p.add_argument("--start", default=None, help="start of period 0, ISO 8601 UTC (default: first record's period)")
    p.add_argument("--group-id", default=None, help="consumer group / faust app id (default aurelius-worker)")
    p.add_argument(
        "--history-from-replay", action="store_true",
        help="policy context and 7-day history built as `aurelius replay` builds them (window flags below)",
    )  # fmt: skip
    p.add_argument("--year", type=int, default=None, help="window year (with --history-from-replay)")
    p.add_argument("--window-rule", choices=("max", "median"), default=None, help="window rule (ditto)")
    p.add_argument("--periods", type=int, default=None, help="control periods of the window (ditto)")
    p.add_argument("--seed", type=int, default=None, help="workload seed (ditto)")
    p.set_defaults(_run="streams.worker_cli:run")

    p = sub.add_parser("publish", help="replay history into the Kafka topics at a chosen speed-up")
    _window_flags(p)
    _kafka_flags(p)
    p.add_argument("--speedup", type=float, default=60.0, help="event-time seconds per wall second")
    p.add_argument("--from-dir", default=None, help="a replay's --emit-observations directory to publish")
    p.add_argument("--topic-prefix", default="aurelius.")
    p.set_defaults(_run="streams.publish:run")

    p = sub.add_parser("audit-sink", help="audit topic -> Parquet audit log, idempotent on decision id")
    _kafka_flags(p)
    p.add_argument("--audit-dir", default="audit")
    p.add_argument("--topic-prefix", default="aurelius.")
    p.set_defaults(_run="sinks.audit_sink:run")

    p = sub.add_parser("audit", help="query the audit log")
    asub = p.add_subparsers(dest="audit_command", required=True, metavar="WHAT")
    a = asub.add_parser("sql", help="run read-only SQL over the audit log (table: audit)")
    a.add_argument("query", help='e.g. "SELECT policy, count(*) FROM audit GROUP BY 1"')
    a.add_argument("--audit-dir", default="audit")
    a.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    a.add_argument("--output", default=None, help="file for csv/json/parquet (default stdout; parquet needs it)")
    a.add_argument("--timeout-s", type=float, default=30.0,
                   help="stop the query after this many seconds (default 30; exit code 3)")
    a.add_argument("--memory-limit", default="1 GB",
                   help='DuckDB memory limit, e.g. "512MB", "4 GB" (default 1 GB; no spilling; exit code 3)')
    a.add_argument("--threads", type=int, default=2, help="DuckDB threads for the query (default 2)")
    a.set_defaults(_run="sinks.sql:run")
    a = asub.add_parser("export", help="one decision's chosen plan as an actuator's input (HPA, KEDA, nvidia-smi, "
                        "vLLM, deferral); printed, never applied")
    a.add_argument("--decision", required=True, help="decision id (or a replay record's live id, or a unique prefix)")
    a.add_argument("--format", required=True, choices=("hpa", "keda", "nvidia-smi", "vllm", "deferral"),
                   help="hpa: autoscaling/v2 HPAs; keda: ScaledObjects; nvidia-smi: SM clock commands; "
                   "vllm: `vllm serve` arguments; deferral: hold/release list of deferrable work")
    a.add_argument("--audit-dir", default="audit")
    a.add_argument("--deployment", default="{model}-{gpu}",
                   help="Deployment name template per pool (keys: model, gpu, site; default {model}-{gpu})")
    a.add_argument("--output", default=None, help="file to write (default stdout)")
    a.set_defaults(_run="sinks.audit_export:run")
    a = asub.add_parser("summary", help="decisions, fallbacks by reason, predicted savings, realized regret, "
                        "top plans (table; --csv FILE)")
    a.add_argument("--audit-dir", default="audit")
    a.add_argument("--csv", default=None, metavar="FILE", help="also write the answers as long-form CSV")
    a.set_defaults(_run="sinks.audit_summary:run")

    p = sub.add_parser("broker", help="local Kafka-compatible broker (Tansu, in memory) for a demo; NOT production")
    p.add_argument("--port", type=int, default=9092)
    p.add_argument("--topic-prefix", default="aurelius.")
    p.set_defaults(_run="streams.broker:run")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "history", None) or getattr(args, "from_topics", None):
        args._run = "streams.history.run:run"
    module_name, func_name = args._run.split(":")
    func = getattr(importlib.import_module(module_name), func_name)

    try:
        return int(func(args) or 0)
    except KafkaUnavailable as exc:  # one line, no traceback: the broker is down or refused us
        print(f"aurelius {args.command}: {exc}", file=sys.stderr, flush=True)
        return EXIT_UNAVAILABLE
    except KafkaSettingsError as exc:
        print(f"aurelius {args.command}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
