"""What the server tells about itself: statistics, the request log, tracing."""
