"""Model monitoring beside the request path: drift of inputs and outputs against a
reference (docs/monitoring.md)."""
