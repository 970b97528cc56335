"""Pipelines: models made of other models (Triton ensembles: `ensemble_config.py` reads and
checks the graph at load, `ensemble.py` runs it)."""
