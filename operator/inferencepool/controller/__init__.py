"""The operator: kopf handlers (handlers/, one module per trigger) over a pure core.

reconcile.py validates, checks (checks.py), builds (builders/, pure) and applies (apply.py, server-side) a
pool's children, and records the outcome in the pool's memory (context.py, kept in kopf's memo). Each pool's
daemon (observer.py) steps its autoscaler and is the one writer of its status, composed by status.py (pure)
from that outcome, the workloads kopf indexes and the autoscaler's readings. The API server door is
inferencepool.kube, a layer below.
"""
