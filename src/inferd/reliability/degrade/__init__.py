"""Degradation tiers (docs/reliability.md#degradation-tiers): a model whose recent p99 passes
a threshold serves a lighter answer (its fallback model, a stale cached answer), refuses its
excess sooner, opens its circuit or rolls a slow canary back, instead of answering late."""
