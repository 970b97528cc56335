"""`inferd tune`: sweep a model's batching and instance settings through the repository API,
measure each candidate with the bench engine, and pick the best within a p99 budget."""
