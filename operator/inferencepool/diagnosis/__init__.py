"""Bottleneck diagnosis: which phase limits a pool (Prefill, Decode, Interference, KVTransfer or None), with
the evidence, the fix that fits, and the simulator's prediction for the alternatives."""
