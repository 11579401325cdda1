"""Bottleneck diagnosis (pure): which phase limits a pool (Prefill, Decode, Interference, KVTransfer or None),
with the evidence and the fix that fits, from a window of the pool's own measurements. The operator runs it
every tick on the pages its autoscaler already scraped (status.bottleneck); `inferencepool diagnose`
(inferencepool.whatif, above the simulator) runs it on pages it scrapes and adds the what-if replay."""
