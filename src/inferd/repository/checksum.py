"""What a model's files are: a cheap stat fingerprint, and a content checksum.

Polling compares fingerprints (names, sizes, mtimes) every round and computes checksums only
when a fingerprint moved; a reload happens only when the content really changed, so a
`touch` or a copy of the same bytes does not reload a model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

Fingerprint = tuple[tuple[str, int, int], ...]


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def fingerprint(directory: Path) -> Fingerprint:
    out = []
    for path in _files(directory):
        st = path.stat()
        out.append((str(path.relative_to(directory)), st.st_size, st.st_mtime_ns))
    return tuple(out)


def checksum(directory: Path) -> str:
    """sha256 over every file's relative path and bytes, in a stable order."""
    digest = hashlib.sha256()
    for path in _files(directory):
        digest.update(str(path.relative_to(directory)).encode())
        digest.update(b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


def file_checksum(path: Path) -> str:
    if not path.is_file():
        return ""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
