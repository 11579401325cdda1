"""`inferencepool diagnose`: the pure diagnosis (inferencepool.bottleneck, which the operator also runs every
tick) over snapshots the command scrapes or reads from files, with the what-if replay through the simulator
(sim/) that the operator never runs (it costs CPU seconds)."""
