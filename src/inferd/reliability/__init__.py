"""Keeping traffic on what can serve it: routing weights, circuit, health score, sliding
windows, degradation tiers (the guards that act on them live in repository/)."""
