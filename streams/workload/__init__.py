"""Workload builder of benchmark protocol v1: classes, window selection, volume, sizes, history."""
