"""An operator's own recorded history as a replay input (`aurelius replay --history DIR | --from-topics ...`).

reader (directory dumps and Kafka topics -> frames per record kind), checks (bad or incomplete history ->
report entries), recorded (the fleet and outcomes the records show), workload (the replay's `Workload`),
fit (the reactive policy fitted to the recorded scaling), fidelity (simulated vs recorded), run (the command).
"""
