"""Pipelines: models made of other models (Triton ensembles: `ensemble_config.py` reads and
checks the graph, `ensemble.py` runs it; their lifecycle is repository/'s)."""
