"""CoefficientCorrections on the ground truth's coefficient rows: none leaves every row bit-identical, each
factor scales only its terms, and a correction reaches only the pools it names."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.fleet import DEFAULT_TP, GpuType, default_fleet
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.runtime import CoefficientCorrections, Physics, _hardware, coef_row
from worldmodel.physics import step_coefficients

CONFIGS = [
    (m, g, DEFAULT_TP[(m, GpuType(g))], prec, clock)
    for m in ("llama-3.1-8b", "llama-3.1-70b")
    for g, clocks, precs in (("H100", (1980.0, 1400.0), ("bf16", "fp8")), ("A100", (1410.0,), ("bf16",)))
    for prec in precs
    for clock in clocks
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_no_corrections_leave_every_row_bit_identical(cfg):
    m, g, tp, prec, clock = cfg
    cited = step_coefficients(m, g, tp, prec, clock).as_array()
    assert Physics().corrections == ()
    np.testing.assert_array_equal(coef_row(m, g, tp, prec, clock, Physics()), cited)
    np.testing.assert_array_equal(coef_row(m, g, tp, prec, clock, Physics(corrections=(CoefficientCorrections(),))),
                                  cited)  # fmt: skip


def test_each_factor_scales_only_its_terms():
    m, g, tp = "llama-3.1-70b", "H100", 4
    cited = coef_row(m, g, tp, "fp8", 1980.0, Physics())
    corr = CoefficientCorrections(prefill_scale=1.2, decode_scale=1.1, idle_power_scale=0.9, active_power_scale=0.8)
    row = coef_row(m, g, tp, "fp8", 1980.0, Physics(corrections=(corr,)))
    np.testing.assert_allclose(row[[st.C_PTOK, st.C_PATTN]], 1.2 * cited[[st.C_PTOK, st.C_PATTN]], rtol=1e-15)
    np.testing.assert_allclose(row[[st.C_BASE, st.C_SEQ, st.C_KV]], 1.1 * cited[[st.C_BASE, st.C_SEQ, st.C_KV]])
    assert row[st.C_IDLE] == pytest.approx(0.9 * cited[st.C_IDLE])
    assert row[st.C_MAXP] - row[st.C_IDLE] == pytest.approx(0.8 * (cited[st.C_MAXP] - cited[st.C_IDLE]))
    untouched = [st.C_KVCAP, st.C_LOAD, st.C_TOKENS]
    np.testing.assert_array_equal(row[untouched], cited[untouched])


def test_a_correction_reaches_only_the_pools_it_names():
    physics = Physics(corrections=(CoefficientCorrections(decode_scale=1.5, model="llama-3.1-8b", gpu="A100"),))
    for m, g, scaled in (("llama-3.1-8b", "A100", True), ("llama-3.1-8b", "H100", False),
                         ("llama-3.1-70b", "A100", False)):  # fmt: skip
        tp = DEFAULT_TP[(m, GpuType(g))]
        ratio = (
            coef_row(m, g, tp, "bf16", 1400.0, physics)[st.C_BASE]
            / coef_row(m, g, tp, "bf16", 1400.0, Physics())[st.C_BASE]
        )
        assert ratio == pytest.approx(1.5 if scaled else 1.0)


def test_a_non_positive_factor_is_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        coef_row("llama-3.1-8b", "H100", 1, "bf16", 1980.0, Physics(corrections=(CoefficientCorrections(0.0),)))


def test_a_set_node_speed_replaces_the_hidden_variation() -> None:
    """Physics.node_speed: every node at that multiplier (a calibrated history's pool factors hold the mean node
    speed); None keeps the hidden per-node variation of the fleet seed."""
    sites = default_fleet(("PJM",)).sites
    hidden = _hardware(sites, 7).node_speed
    assert hidden.std() > 0.01 and ((hidden >= 0.85) & (hidden <= 1.15)).all()
    assert (_hardware(sites, 7, 1.0).node_speed == 1.0).all()
