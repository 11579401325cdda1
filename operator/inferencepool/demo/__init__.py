"""`inferencepool demo`: the whole product on this machine (run), with its load step (step, plot), its
LMCache p2p step (p2p) and the Prometheus `--keep` leaves running (prometheus)."""
