"""Where a period's energy price sits in the recent past: the price regime candidate generation reads.

A period is expensive when its price is at or above `EXPENSIVE_PERCENTILE` of the prices published for the past
week, cheap at or below `CHEAP_PERCENTILE` (conventions: the quartiles).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Share of the past week's prices at or below the period's price from which the period is expensive (ratio).
EXPENSIVE_PERCENTILE = 0.75
#: ... up to which it is cheap (ratio).
CHEAP_PERCENTILE = 0.25


def price_percentile(price_usd_mwh: float, past_usd_mwh: Sequence[float]) -> float:
    """Share of `past_usd_mwh` ($/MWh) at or below `price_usd_mwh` ($/MWh); 0.5 when there is no past.

    >>> price_percentile(80.0, [20.0, 40.0, 60.0, 100.0]), price_percentile(80.0, [])
    (0.75, 0.5)
    """
    past = np.asarray(past_usd_mwh, dtype=float)
    return float((past <= price_usd_mwh).mean()) if past.size else 0.5
