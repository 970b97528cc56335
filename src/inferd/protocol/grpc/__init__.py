"""The gRPC adapter: Triton's `inference.GRPCInferenceService` over the DataPlane."""
