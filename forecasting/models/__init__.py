"""Pool members (point models) and their registry."""

from forecasting.models.base import PointModel, make_model, model_names, register_model

__all__ = ["PointModel", "make_model", "model_names", "register_model"]
