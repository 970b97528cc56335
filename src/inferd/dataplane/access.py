"""Who may call what: Triton's API groups, each behind a credential when one is configured.

Two kinds of credential, checked the same way for HTTP and gRPC:

- Triton's restricted APIs: `--http-restricted-api GROUPS:KEY=VALUE` (the HTTP header KEY
  must hold VALUE) and `--grpc-restricted-protocol GROUPS:KEY=VALUE` (the gRPC metadata
  `triton-grpc-protocol-KEY`, as Triton names it);
- an admin token (`--admin-token-file`, `INFERD_ADMIN_TOKEN`), sent as
  `authorization: Bearer <token>`, which guards the admin groups on both protocols.

A group guarded by both accepts either. The adapters only say which group a call belongs
to (one table each) and how to read a header; the decision is made here, once, and every
secret is compared in constant time (`hmac.compare_digest`).
"""

from __future__ import annotations

import enum
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inferd.errors import ErrorKind, InferdError


class ApiGroup(enum.Enum):
    """Triton's API groups (its `--http-restricted-api` names)."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"  # load, unload, index; inferd's routing calls too
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"


# What the admin token guards: the calls that change what the server runs or records.
ADMIN_GROUPS = frozenset(
    {ApiGroup.MODEL_REPOSITORY, ApiGroup.SHARED_MEMORY, ApiGroup.TRACE, ApiGroup.LOGGING}
)
PROTOCOLS = ("http", "grpc")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
AUTHORIZATION = "authorization"
TOKEN_ENV = "INFERD_ADMIN_TOKEN"
MIN_TOKEN_CHARS = 16

# gRPC metadata keys are lower case from this set (and HTTP accepts them as header names).
_KEY = re.compile(r"[0-9a-z_.-]+")
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")

Lookup = Callable[[str], str | None]  # a header (lower-case name) -> its value, or None


class AccessError(ValueError):
    """An access setting inferd cannot honour; the message names the option."""


@dataclass(frozen=True, slots=True)
class Credential:
    header: str  # lower case: the HTTP header or gRPC metadata key it arrives in
    secret: bytes
    bearer: bool  # the header holds "Bearer <secret>"
    hint: str  # how to send it, for the 401 message (never the secret)

    def accepts(self, presented: str | None) -> bool:
        if presented is None:
            return False
        if self.bearer:
            scheme, _, rest = presented.partition(" ")
            if scheme.lower() != "bearer":
                return False
            presented = rest.strip()
        return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), self.secret)


def parse_restriction(spec: str, option: str) -> tuple[list[ApiGroup], str, str]:
    """Triton's `API[,API...]:KEY=VALUE` -> (groups, key in lower case, value)."""
    apis, colon, credential = spec.partition(":")
    key, equals, value = credential.partition("=")
    if not colon or not equals:
        raise AccessError(f"{option} '{spec}': expected API[,API...]:KEY=VALUE")
    groups = []
    known = {g.value: g for g in ApiGroup}
    for api in apis.split(","):
        group = known.get(api.strip())
        if group is None:
            raise AccessError(
                f"{option} '{apis}': unknown API '{api.strip()}'; known: {', '.join(known)}"
            )
        groups.append(group)
    key = key.strip().lower()
    if not _KEY.fullmatch(key) or key.endswith("-bin"):
        raise AccessError(
            f"{option} '{apis}:{key}=...': the key must be a header name of a-z, 0-9, '-', "
            "'_' and '.' (not ending in -bin)"
        )
    if not _HEADER_VALUE.fullmatch(value):
        raise AccessError(
            f"{option} '{apis}:{key}=...': the value must be printable ASCII, without "
            "leading or trailing spaces"
        )
    return groups, key, value


def check_token(token: str, source: str) -> str:
    if not _VISIBLE_ASCII.fullmatch(token) or len(token) < MIN_TOKEN_CHARS:
        raise AccessError(
            f"{source}: the admin token must be at least {MIN_TOKEN_CHARS} characters of "
            "printable ASCII without spaces"
        )
    return token


class AccessPolicy:
    """The credentials each (protocol, API group) needs; no entry means open."""

    def __init__(
        self,
        http_restricted: Iterable[str] = (),
        grpc_restricted: Iterable[str] = (),
        admin_token: str = "",
    ) -> None:
        self._rules: dict[str, dict[ApiGroup, tuple[Credential, ...]]] = {p: {} for p in PROTOCOLS}
        options = {"http": "--http-restricted-api", "grpc": "--grpc-restricted-protocol"}
        for protocol, specs in (("http", http_restricted), ("grpc", grpc_restricted)):
            option = options[protocol]
            for spec in specs:
                groups, key, value = parse_restriction(spec, option)
                header = key if protocol == "http" else GRPC_HEADER_PREFIX + key
                where = "header" if protocol == "http" else "metadata"
                credential = Credential(
                    header, value.encode(), False, f"{where} '{header}' ({option})"
                )
                for group in groups:
                    if group in self._rules[protocol]:
                        # Triton's rule: one group, one restriction.
                        raise AccessError(
                            f"{option}: API '{group.value}' is named in more than one restriction"
                        )
                    self._rules[protocol][group] = (credential,)
        if admin_token:
            token = Credential(
                AUTHORIZATION,
                check_token(admin_token, "--admin-token-file / " + TOKEN_ENV).encode(),
                True,
                f"'{AUTHORIZATION}: Bearer <admin token>' (--admin-token-file / {TOKEN_ENV})",
            )
            for rules in self._rules.values():
                for group in ADMIN_GROUPS:
                    rules[group] = (*rules.get(group, ()), token)

    def guards(self, protocol: str, group: ApiGroup) -> bool:
        return group in self._rules[protocol]

    def headers(self, protocol: str, group: ApiGroup) -> list[str]:
        """The headers the credentials of `group` arrive in (for adapters that pick
        headers by name)."""
        return [c.header for c in self._rules[protocol].get(group, ())]

    def credentials(self, protocol: str, group: ApiGroup) -> list[tuple[str, bool]]:
        """How each credential `group` accepts arrives, never what it holds: (header,
        whether it is a bearer token), for documents that describe the API (OpenAPI's
        security schemes)."""
        return [(c.header, c.bearer) for c in self._rules[protocol].get(group, ())]

    def check(self, protocol: str, group: ApiGroup, header: Lookup) -> None:
        """Raise UNAUTHENTICATED unless the call presents a credential `group` accepts."""
        credentials = self._rules[protocol].get(group)
        if not credentials:
            return
        # Every credential is compared, accepted or not, so the time taken does not say
        # which of them was close.
        accepted = [c.accepts(header(c.header)) for c in credentials]
        if not any(accepted):
            raise InferdError(
                ErrorKind.UNAUTHENTICATED,
                f"the {group.value} API is restricted: send "
                + " or ".join(c.hint for c in credentials),
            )
