"""The model repository: the registry of loaded models and versions, loading (instances,
warm-up, schedulers), the watcher, uploads, and what acts on loaded models (the canary and
degradation guards, ensemble states)."""
