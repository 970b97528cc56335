"""Model monitoring beside the request path: the capture's files and writers, ground-truth
feedback and online accuracy (docs/capture.md; the sampling itself is dataplane/capture.py);
drift of inputs and outputs against a reference (docs/monitoring.md)."""
