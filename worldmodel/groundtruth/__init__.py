"""The ground-truth serving simulator: the ruler every policy is measured with.

Nothing under optimizer/, forecasting/ or the planner's model (worldmodel.servingmodel, .forward, .snapshot,
.selfcal, .state) may import this package, and it imports only the contract (schemas/) and its physics: the
import-linter contracts in pyproject.toml, checked by tests/test_layers.py.
It has effects the planner must learn from telemetry: per-node step-time variation up to +-15%, thermal
throttling under sustained high clock, a site power-cap controller, and output lengths unknown until done.
"""
