"""Files uploaded with a load call (Triton's `file:<path>` parameters): whether they may be,
and where they may go.

Uploading is off unless `--allow-model-upload` is given, and even then code is refused
(anything the server would import or link: a Python backend's model.py, any Python file, a
shared library) unless it is `--allow-model-upload=code`: a load that brings its own code
runs it inside the server, as the server's user. Uploaded files go into a fresh temporary
directory, never into the repository, and every name is checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from inferd.errors import ErrorKind, InferdError, invalid

UPLOAD_MODES = ("off", "files", "code")
CODE_SUFFIXES = frozenset({".py", ".pyc", ".pyo", ".pyw", ".pyd", ".so", ".dylib", ".dll"})
NAME_MAX_BYTES = 255  # a file name's limit on Linux (NAME_MAX)
MAX_DEPTH = 8  # directories an uploaded path may nest (Triton's are 2: version/file)


def shown(text: str, limit: int = 64) -> str:
    """`text` fit for an error message: control characters escaped, the length bounded."""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."


def is_code(path: str) -> bool:
    return any(s.lower() in CODE_SUFFIXES for s in PurePosixPath(path).suffixes)


def check_allowed(paths: Iterable[str], mode: str) -> None:
    """PERMISSION_DENIED unless `--allow-model-upload` (`mode`) lets these files in."""
    paths = list(paths)
    if not paths:
        return
    if mode not in ("files", "code"):
        raise InferdError(
            ErrorKind.PERMISSION_DENIED,
            f"parameter 'file:{shown(paths[0])}': uploading model files with load is "
            "disabled; start inferd with --allow-model-upload to allow it",
        )
    if mode != "code":
        code = next((p for p in paths if is_code(p)), None)
        if code is not None:
            raise InferdError(
                ErrorKind.PERMISSION_DENIED,
                f"parameter 'file:{shown(code)}' is executable code (Python or a shared "
                "library), which the server would run; uploading code is disabled: start "
                "inferd with --allow-model-upload=code to allow it",
            )


def checked_paths(names: Iterable[str]) -> dict[str, PurePosixPath]:
    """Each `file:` name -> its path inside the model directory; 400 naming the parameter
    for a name that is empty, escapes the directory, holds control characters, is too long,
    or collides with another (a file where another needs a directory)."""
    paths: dict[str, PurePosixPath] = {}
    by_path: dict[PurePosixPath, str] = {}
    for name in names:
        parameter = f"parameter 'file:{shown(name)}'"
        if any(not c.isprintable() for c in name):
            raise invalid(f"{parameter}: control characters are not allowed in file names")
        if "\\" in name:
            raise invalid(f"{parameter}: use '/' to separate directories, not '\\'")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if name.startswith("/") or ".." in parts:
            raise invalid(f"file parameter '{shown(name)}' points outside the model directory")
        if not parts:
            raise invalid(f"{parameter} names no file")
        if len(parts) > MAX_DEPTH:
            raise invalid(f"{parameter}: more than {MAX_DEPTH} directories deep")
        if any(len(p.encode()) > NAME_MAX_BYTES for p in parts):
            raise invalid(f"{parameter}: a name in it is longer than {NAME_MAX_BYTES} bytes")
        path = PurePosixPath(*parts)
        if path in by_path:
            raise invalid(f"{parameter} and 'file:{shown(by_path[path])}' name the same file")
        paths[name] = path
        by_path[path] = name
    for name, path in paths.items():
        for parent in path.parents:
            if parent in by_path:
                raise invalid(
                    f"parameter 'file:{shown(by_path[parent])}' is a file, but "
                    f"'file:{shown(name)}' needs '{parent}' to be a directory"
                )
    return paths


def check_model_name(name: str) -> None:
    """A model name is a directory name: one path component, not hidden, printable."""
    problem = ""
    if not name:
        problem = "it is empty"
    elif any(not c.isprintable() for c in name):
        problem = "control characters are not allowed"
    elif "/" in name or "\\" in name:
        problem = "it must not hold '/' or '\\'"
    elif name.startswith("."):
        problem = "it must not start with '.'"
    elif len(name.encode()) > NAME_MAX_BYTES:
        problem = (
            f"{len(name.encode())} bytes, more than the {NAME_MAX_BYTES} a directory name may have"
        )
    if problem:
        raise invalid(f"invalid model name '{shown(name)}': {problem}")


def write_files(model_dir: Path, paths: dict[str, PurePosixPath], files: dict[str, bytes]) -> None:
    """Write uploads (names already checked) into a fresh directory. Runs in a thread."""
    root = model_dir.resolve()
    for name, relative in paths.items():
        path = root / relative
        if root not in path.parents:  # checked_paths made sure; this is the last guard
            raise invalid(f"file parameter '{shown(name)}' points outside the model directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
