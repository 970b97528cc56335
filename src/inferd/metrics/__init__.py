"""Prometheus metrics: the inferd_* families built at scrape time, Triton's names, the endpoint."""
