"""Reference policies of DESIGN.md behind the shared Policy interface: production (as deployed),
production-tuned (best static configuration + price rule) and naive."""

from optimizer.baselines.naive import NaivePolicy
from optimizer.baselines.production import ProductionPolicy
from optimizer.baselines.tuned import TunedProductionPolicy

__all__ = ["NaivePolicy", "ProductionPolicy", "TunedProductionPolicy"]
