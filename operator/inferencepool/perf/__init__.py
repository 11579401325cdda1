"""The performance model, one table for everyone: model shapes (`models.py`), GPU profiles (`profiles.py`) and
the roofline step times (`timing.py`).

The API reads a model's KV bytes per token and context length from it (defaults that depend on the model), the
autoscaler its capacity estimate, the fake engine and the simulator their step times. It imports nothing else
of the project, so the product and the tooling can both stand on it.
"""
