"""Fit the per-iteration step model on the bundled measured rows and score it on held-out rows.

Iteration time (s) = x . theta with features
x = [1, n_decode, kv_tokens, prefill_tokens, prefill_tokens x context_tokens] and theta = (base_s, per_seq_s,
per_kv_token_s, per_prefill_token_s, per_prefill_attn_s), fitted by non-negative least squares on relative
error. How each measured row maps onto iterations is in `docs/physics.md`:

* Splitwise (llama2-70b, batch-synchronous runs): prompt_time = one prefill iteration of batch x prompt tokens
  with mean attended context prompt/2; token_time = one decode iteration of `batch` sequences at mean
  context prompt + output/2.
* AIConfigurator (closed loop at concurrency c, isl/osl): TPOT = a decode iteration of c sequences at context
  isl + osl/2 plus the amortized prefill of c/osl requests per iteration; TTFT = half an iteration of
  residual wait plus the chunked prefill iterations (8,192-token budget) with c - 1 decodes riding along,
  plus two fitted nuisance terms that are not exported (a frontend overhead in s, and closed-loop queueing
  behind other requests' prefills, s per concurrency x isl token): the simulator models its own queueing.

Rows whose KV demand (concurrency x (isl + osl)) exceeds the engine's KV capacity are queue-bound, not
step-bound, and are dropped before fitting and scoring. Held-out rows: every 5th distinct configuration point
(sorted, positions 1, 6, 11, ...), separately for the prefill and decode keys of each fitted
configuration; all repeats of a point go to the same side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
from scipy.optimize import nnls

from worldmodel.physics.tables import kv_capacity_tokens, roofline_floors

HOLDOUT_EVERY = 5
CHUNK_TOKENS = 8192
SPLITWISE = "splitwise"
AICONFIGURATOR = "aiconfigurator"
SPLITWISE_HW = {"a100-80gb": "A100", "h100-80gb": "H100"}
AIC_MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b"}


def data_root() -> Path:
    """The bundled data folder: the wheel's `aurelius_data`, else the source tree's `data/`."""
    try:
        import aurelius_data  # type: ignore[import-not-found]  # lazy: present only in an installed wheel

        return Path(aurelius_data.__path__[0])
    except ImportError:
        return Path(__file__).resolve().parents[2] / "data"


@dataclass(frozen=True)
class Rows:
    """Measured rows of one configuration mapped onto the step model (one metric: prefill or decode)."""

    x: np.ndarray  # (n, 7) features: the 5 step terms, then 2 TTFT-only nuisance terms (AIConfigurator)
    y_s: np.ndarray  # (n,) measured time (s)
    held_out: np.ndarray  # (n,) bool


@dataclass(frozen=True)
class Fit:
    """A fitted configuration: coefficients and its train / held-out median absolute percentage errors."""

    dataset: str
    model: str
    gpu: str
    tp: int
    precision: str
    theta: np.ndarray
    prefill: Rows
    decode: Rows

    def mape(self, metric: str, held_out: bool = True) -> float:
        """Median absolute percentage error (%) of `metric` ('prefill' | 'decode'), held-out or train rows."""
        rows: Rows = getattr(self, metric)
        sel = rows.held_out if held_out else ~rows.held_out
        if not sel.any():
            return math.nan
        ape = np.abs(rows.x[sel] @ self.theta / rows.y_s[sel] - 1.0)
        return float(100.0 * np.median(ape))


def _holdout(keys: list[tuple]) -> np.ndarray:
    distinct = sorted(set(keys))
    out = {k for i, k in enumerate(distinct) if i % HOLDOUT_EVERY == 1}
    return np.array([k in out for k in keys], dtype=bool)


def _decode_x(n: float, ctx: float) -> list[float]:
    return [1.0, n, n * ctx, 0.0, 0.0, 0.0, 0.0]


def _prefill_x(tokens: float, ctx: float) -> list[float]:
    return [0.0, 0.0, 0.0, tokens, tokens * ctx, 0.0, 0.0]


def _rows(x: list[list[float]], y_ms: list[float], keys: list[tuple]) -> Rows:
    return Rows(np.asarray(x, dtype=np.float64), np.asarray(y_ms) / 1e3, _holdout(keys))


@cache
def splitwise_frame() -> pl.DataFrame:
    """Llama2-70B rows of the Splitwise table (ms), hardware incl. the power-capped H100."""
    path = data_root() / "calibration" / "splitwise_perf_model" / "perf_model.csv.gz"
    return pl.read_csv(path).filter(pl.col("model") == "llama2-70b")


@cache
def aiconfigurator_frame() -> pl.DataFrame:
    """Llama-3.1 8B/70B aggregated-serving rows on h100_sxm (ms); bf16 where precision is empty."""
    path = data_root() / "calibration" / "aiconfigurator_silicon" / "silicon_sample.csv.gz"
    df = pl.read_csv(path, infer_schema_length=10000)
    return df.filter(
        pl.col("model_path").is_in(list(AIC_MODELS))
        & (pl.col("system") == "h100_sxm")
        & (pl.col("mode") == "agg")
    ).with_columns(pl.col("precision").fill_null("bf16"))


def splitwise_rows(gpu: str, tp: int, hardware: str | None = None) -> tuple[Rows, Rows]:
    """(prefill, decode) rows of Splitwise llama2-70b on `gpu` at `tp` (bf16), KV-feasible only."""
    hw = hardware or {v: k for k, v in SPLITWISE_HW.items()}[gpu]
    df = splitwise_frame().filter((pl.col("hardware") == hw) & (pl.col("tensor_parallel") == tp))
    cap = kv_capacity_tokens("llama-3.1-70b", gpu, tp, "bf16")
    px, py, pk, dx, dy, dk = [], [], [], [], [], []
    for p, b, o, pt, tt in df.select(
        "prompt_size", "batch_size", "token_size", "prompt_time", "token_time"
    ).rows():
        if b * (p + o) > cap:
            continue
        px.append(_prefill_x(b * p, p / 2.0))
        px[-1][0] = 1.0
        py.append(pt)
        pk.append((p, b))
        dx.append(_decode_x(b, p + o / 2.0))
        dy.append(tt)
        dk.append((p, b, o))
    return _rows(px, py, pk), _rows(dx, dy, dk)


def aic_rows(model: str, tp: int, precision: str) -> tuple[Rows, Rows]:
    """(TTFT, TPOT) rows of AIConfigurator for `model` on H100 at `tp`, KV-feasible only.

    The measured engines keep a bf16 KV cache (vLLM/TRT-LLM default), so feasibility uses bf16 KV bytes.
    """
    name = {v: k for k, v in AIC_MODELS.items()}[model]
    df = aiconfigurator_frame().filter(
        (pl.col("model_path") == name) & (pl.col("tp_size") == tp) & (pl.col("precision") == precision)
    )
    cap = kv_capacity_tokens(model, "H100", tp, precision, kv_dtype="auto")
    px, py, dx, dy, keys = [], [], [], [], []
    cols = ("isl", "osl", "batch_size", "silicon_ttft_ms", "silicon_tpot_ms")
    for isl, osl, c, ttft, tpot in df.select(*cols).rows():
        if c * (isl + osl) > cap:
            continue
        ctx = isl + osl / 2.0
        amort = c / osl
        dx.append([a + b for a, b in zip(_decode_x(c, ctx), _prefill_x(amort * isl, isl / 2.0), strict=True)])
        dy.append(tpot)
        chunks = math.ceil(isl / (CHUNK_TOKENS - c))
        ride = [(0.5 + chunks) * v for v in _decode_x(c - 1.0, ctx)]
        px.append([a + b for a, b in zip(ride, _prefill_x(isl, isl / 2.0), strict=True)])
        px[-1][5:] = [1.0, c * isl]  # nuisance: frontend overhead, closed-loop queueing behind other prefills
        py.append(ttft)
        keys.append((isl, osl, c))
    return _rows(px, py, keys), _rows(dx, dy, keys)


def fit_rows(prefill: Rows, decode: Rows, floor: np.ndarray) -> np.ndarray:
    """Least squares on relative error over the training rows of both metrics, theta >= floor."""
    train = [(r.x[~r.held_out], r.y_s[~r.held_out]) for r in (prefill, decode)]
    a = np.vstack([x / y[:, None] for x, y in train])
    b = np.concatenate([1.0 - x @ floor / y for x, y in train])
    delta, _ = nnls(a, b)
    return floor + delta


@cache
def fitted(dataset: str, model: str, gpu: str, tp: int, precision: str) -> Fit:
    """Fit one measured configuration (training rows only); ValueError when the dataset has no such rows."""
    if dataset == SPLITWISE and model == "llama-3.1-70b" and precision == "bf16":
        prefill, decode = splitwise_rows(gpu, tp)
    elif dataset == AICONFIGURATOR and gpu == "H100":
        prefill, decode = aic_rows(model, tp, precision)
    else:
        raise ValueError(f"{dataset} has no rows for {model} {gpu} TP{tp} {precision}")
    if len(prefill.y_s) == 0 or len(decode.y_s) == 0:
        raise ValueError(f"{dataset} has no KV-feasible rows for {model} {gpu} TP{tp} {precision}")
    lo = roofline_floors(model, gpu, tp, precision, kv_dtype="auto")  # every measured engine kept a bf16 KV cache
    floor = np.array(
        [0.0, 0.0, lo["per_kv_token_s"], lo["per_prefill_token_s"], lo["per_prefill_attn_s"], 0, 0]
    )
    return Fit(dataset, model, gpu, tp, precision, fit_rows(prefill, decode, floor), prefill, decode)


#: Every measured configuration that gets fitted and scored (dataset, model, gpu, tp, precision).
MEASURED_CONFIGS: tuple[tuple[str, str, str, int, str], ...] = (
    *((SPLITWISE, "llama-3.1-70b", g, tp, "bf16") for g in ("H100", "A100") for tp in (2, 4, 8)),
    *((AICONFIGURATOR, "llama-3.1-70b", "H100", tp, "fp8") for tp in (2, 4, 8)),
    *((AICONFIGURATOR, "llama-3.1-8b", "H100", tp, "bf16") for tp in (1, 2, 4, 8)),
)


@cache
def splitwise_a100_ratio(tp: int) -> tuple[float, float]:
    """(decode, prefill) A100 / H100 time ratios of Splitwise llama2-70b at `tp` (same engine, same rows).

    Geometric mean over configuration points measured and KV-feasible on both GPUs (repeats averaged).
    """
    out = []
    for metric in ("decode", "prefill"):
        means = []
        for gpu in ("A100", "H100"):
            rows: Rows = dict(zip(("prefill", "decode"), splitwise_rows(gpu, tp), strict=True))[metric]
            keys = [tuple(r) for r in rows.x]
            means.append({k: float(np.mean(rows.y_s[[kk == k for kk in keys]])) for k in set(keys)})
        common = sorted(set(means[0]) & set(means[1]))
        out.append(float(np.exp(np.mean([np.log(means[0][k] / means[1][k]) for k in common]))))
    return out[0], out[1]
