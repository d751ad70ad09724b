"""An operator's own recorded history as a replay input (`aurelius replay --history DIR | --from-topics ...`).

config (the operator's TOML), reader (directory dumps and Kafka topics -> frames per record kind), checks (bad
or incomplete history -> `report.HistoryReport` entries), recorded (the fleet, replica spans and outcomes the
records show), workload (the replay's `Workload`), fit (the as-deployed policies: the recorded fleet imposed,
the autoscaler fitted to the recorded scaling), fidelity (simulated vs recorded), savings (per day), run (the
command).
"""
