"""Keeping traffic on what can serve it: routing weights, canary guard, circuit, health,
degradation."""
