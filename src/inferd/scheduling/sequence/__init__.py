"""The sequence batcher (Triton's `sequence_batching`, docs/sequences.md)."""
