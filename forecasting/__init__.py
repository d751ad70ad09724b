"""Forecasters of arrivals, request sizes and prices with calibrated intervals and a confidence score.

Entry points: `forecasting.base.create(name, **config)` / `names()` (the registry), `Forecast` (the frozen
result), `forecasting.bundle.MarketForecaster` (the per-period facade the optimizer calls) and
`streams.forecast_eval_cli.run` (`aurelius forecast-eval`). statsforecast and river are imported only when a
model that needs them first forecasts. See docs/forecasting.md.
"""
