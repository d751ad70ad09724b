"""Model set-up and correctness: build the stack and caches, probe and calibrate fp8, check decode/attention/fp8."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

from .model import KV, Lin, Model, calibrating
from .timing import rel_err, sync

if TYPE_CHECKING:
    from .runner import Runner


def build(r: Runner) -> None:
    """Build the model and KV caches (sizes in GB under res["memory"]), choose attention, set up fp8 if it works."""
    c, dev = r.cfg, r.dev
    t = time.time()
    r.model = Model(c, dev, r.dtype, seed=r.args.seed)
    r.kv = KV(c, max(c.batches), c.ctx + 1, dev, r.dtype, r.model.gen, fill=True)
    r.kv_pre = KV(c, 1, max(c.prefill), dev, r.dtype, r.model.gen, fill=False)
    sync(dev)
    r.res["memory"] = {
        "weights_bf16_gb": round(r.model.weight_bytes(False) / 1e9, 3),
        "kv_decode_gb": round(r.kv.nbytes() / 1e9, 3),
        "kv_prefill_gb": round(r.kv_pre.nbytes() / 1e9, 3),
        "build_s": round(time.time() - t, 2),
    }
    r.res["attention"] = r.model.choose_attention()
    # fp8 capability check on a small product, then static activation scales from a bf16 prefill
    r.fp8_ok = False
    try:
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            raise RuntimeError("torch has no float8_e4m3fn/_scaled_mm")
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
            raise RuntimeError("fp8 matmul needs compute capability >= 8.9")
        probe = Lin(64, 128, dev, r.dtype, r.model.gen)
        probe.make_fp8()
        xp = torch.randn(5, 128, device=dev, dtype=r.dtype)
        probe.a_amax.copy_(xp.abs().amax().float())
        probe.finish_calibration()
        e = rel_err(probe(xp, True), probe(xp, False))
        if not e < 0.2:
            raise RuntimeError(f"fp8 probe relative error {e}")
        r.model.make_fp8()
        x = torch.randn(min(512, max(c.prefill)), c.hidden, device=dev, dtype=r.dtype, generator=r.model.gen)
        with calibrating():
            r.model.prefill(x, None, False)
        for lin in r.model.linears():
            lin.finish_calibration()
        sync(dev)
        r.fp8_ok = True
        r.res["fp8_probe_rel_err"] = e
    except Exception as e:  # noqa: BLE001
        r.err("fp8 setup (fp8 runs skipped)", e)
    r.res["fp8_available"] = r.fp8_ok
    r.log(
        f"built model ({c.params() / 1e9:.2f} B params), KV {r.kv.nbytes() / 1e9:.1f} GB, "
        f"fp8 {'ok' if r.fp8_ok else 'SKIPPED'}, attention {r.res['attention']}"
    )


def checks(r: Runner) -> None:
    """Correctness: decode with a prefilled cache == prefill of one more token; attention variants agree;
    fp8 logits close to bf16."""
    c, dev, m = r.cfg, r.dev, r.model
    out: dict = {}
    t_len = min(64, c.ctx)
    x = torch.randn(t_len, c.hidden, device=dev, dtype=r.dtype, generator=m.gen)
    kvc = KV(c, 1, t_len, dev, r.dtype, m.gen, fill=False)
    ref = m.prefill(x, None, False).float()
    m.prefill(x[:-1], kvc, False)
    got = m.decode(x[-1:], kvc, t_len - 1, False).float()
    out["decode_vs_prefill_rel_err_bf16"] = rel_err(got, ref)
    # decode attention variants against an explicit expanded-KV float32 reference
    b, s = 3, 40
    q = torch.randn(b, c.q_heads, c.head_dim, device=dev, dtype=r.dtype)
    k = torch.randn(b, c.kv_heads, s, c.head_dim, device=dev, dtype=r.dtype)
    v = torch.randn(b, c.kv_heads, s, c.head_dim, device=dev, dtype=r.dtype)
    rep = c.q_heads // c.kv_heads
    kr, vr = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    w = torch.softmax(torch.einsum("bhd,bhsd->bhs", q.float(), kr) / math.sqrt(c.head_dim), -1)
    aref = torch.einsum("bhs,bhsd->bhd", w, vr).reshape(b, -1)
    saved = c.decode_attn
    for mode in ("fold", "gqa"):
        c.decode_attn = mode
        try:
            out[f"decode_attn_{mode}_rel_err"] = rel_err(m.decode_attention(q, k, v).float(), aref)
        except Exception as e:  # noqa: BLE001
            out[f"decode_attn_{mode}_rel_err"] = f"error: {e!r}"[:200]
    c.decode_attn = saved
    if r.fp8_ok:
        b = min(8, max(c.batches))
        xb = torch.randn(b, c.hidden, device=dev, dtype=r.dtype, generator=m.gen)
        l16 = m.decode(xb, r.kv, c.ctx, False).float()
        l8 = m.decode(xb, r.kv, c.ctx, True).float()
        out["fp8_vs_bf16_decode_logits_rel_err"] = rel_err(l8, l16)
        out["fp8_vs_bf16_prefill_logits_rel_err"] = rel_err(m.prefill(x, None, True).float(), ref)
    sync(dev)
    bad = [k for k, v in out.items() if isinstance(v, float) and not (v < (0.05 if "fp8" not in k else 0.5))]
    out["ok"] = not bad
    if bad:
        out["failed"] = bad
    r.res["checks"] = out
    r.log("checks: " + ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()))
