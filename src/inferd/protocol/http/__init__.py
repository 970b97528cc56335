"""The HTTP adapter: KServe v2 REST and Triton's extensions over the DataPlane."""
