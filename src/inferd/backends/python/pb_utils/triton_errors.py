"""`TritonError` (fails one request) and `TritonModelException` (raised by or to model code)."""

from __future__ import annotations


class TritonModelException(Exception):  # noqa: N818 (Triton's name)
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


def not_supported(api: str, why: str = "") -> TritonModelException:
    """The error for a Triton Python-backend API inferd does not offer; it names the API."""
    return TritonModelException(
        f"{api} is not supported by inferd's Python backend{'; ' + why if why else ''}"
    )


class TritonError:
    """An error answering one request; `code` picks the status the client gets."""

    # TRITONSERVER_Error_Code values, as Triton numbers them.
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError: message must be a string, not None")
        if not isinstance(code, int) or not TritonError.UNKNOWN <= code <= TritonError.CANCELLED:
            raise TypeError(f"TritonError: code {code!r} is not one of TritonError's codes")
        self._msg = message
        self._code = code

    def message(self) -> str:
        return self._msg

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._msg
