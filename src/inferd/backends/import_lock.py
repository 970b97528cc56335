"""One import of a model's code at a time in a process.

Models load concurrently, each in a thread. Two threads importing the same package at once
can see it half initialised: `KeyError: 'torch.version'` was seen at start with the example
repository, and a server exited at start inside `import torch` while another model's
model.py ran its own imports. A backend's import (torch, onnxruntime) and the run of a
Python model's model.py, which imports what the model needs, hold this lock; after the
first import a backend's is a dict lookup.
"""

from __future__ import annotations

import threading

IMPORT_LOCK = threading.Lock()

__all__ = ["IMPORT_LOCK"]
