"""Loaders for the bundled public data: hourly prices, request traces and the ServeGen rate shape.

Every loader returns polars frames with UTC timestamps; quirks of each source are handled explicitly and
gaps are reported (`prices.price_gaps`), never filled.
"""
