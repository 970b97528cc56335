"""The wire protocols over the DataPlane: http/ and grpc/ adapters, and what both use (access
gates, TLS, offloading large bodies, strict header values, the text of errors)."""
