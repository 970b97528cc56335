"""The Python backend: inferd's and Triton's model APIs, BLS, model prints, shared arrays."""
