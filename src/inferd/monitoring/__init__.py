"""Model monitoring beside the request path: sampled capture, ground-truth feedback and
online accuracy (docs/capture.md); drift of inputs and outputs against a reference
(docs/monitoring.md)."""
