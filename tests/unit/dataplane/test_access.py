"""The access policy on its own: Triton's restriction syntax, the admin token, and which
credential a group accepts (the servers' tests run the same checks over the wire)."""

from __future__ import annotations

import pytest

from inferd.dataplane.access import AccessError, AccessPolicy, ApiGroup, parse_restriction
from inferd.errors import ErrorKind, InferdError

TOKEN = "0123456789abcdef-token"


def test_triton_syntax_parses_groups_key_and_value() -> None:
    groups, key, value = parse_restriction("model-repository, statistics:Admin-Key=a=b c", "--x")
    assert groups == [ApiGroup.MODEL_REPOSITORY, ApiGroup.STATISTICS]
    assert key == "admin-key"  # header names are case-insensitive; gRPC wants lower case
    assert value == "a=b c"  # only the first '=' separates


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nope:k=v", ["unknown API 'nope'", "model-repository"]),
        ("model-repository", ["expected API[,API...]:KEY=VALUE"]),
        ("model-repository:k", ["expected API[,API...]:KEY=VALUE"]),
        ("model-repository:=v", ["the key must be"]),
        ("model-repository:k y=v", ["the key must be"]),
        ("model-repository:key-bin=v", ["the key must be"]),
        ("model-repository:k=", ["the value must be printable ASCII"]),
        ("model-repository:k= v", ["the value must be printable ASCII"]),
        ("model-repository:k=caf\u00e9", ["the value must be printable ASCII"]),
    ],
)
def test_malformed_restrictions_name_the_option(spec: str, words: list[str]) -> None:
    with pytest.raises(AccessError) as info:
        AccessPolicy(http_restricted=[spec])
    assert str(info.value).startswith("--http-restricted-api")
    for word in words:
        assert word in str(info.value)


def test_a_group_in_two_restrictions_is_refused_as_triton_does() -> None:
    with pytest.raises(AccessError, match="API 'health' is named in more than one"):
        AccessPolicy(grpc_restricted=["model-repository,health:k1=v1", "metadata,health:k2=v2"])


@pytest.mark.parametrize("token", ["short", "with spaces in it, long enough", "x" * 15])
def test_weak_tokens_are_refused(token: str) -> None:
    with pytest.raises(AccessError, match="at least 16 characters"):
        AccessPolicy(admin_token=token)


def denied(policy: AccessPolicy, protocol: str, group: ApiGroup, headers: dict[str, str]) -> str:
    try:
        policy.check(protocol, group, headers.get)
    except InferdError as exc:
        assert exc.kind is ErrorKind.UNAUTHENTICATED
        return exc.message
    return ""


def test_a_group_guarded_twice_accepts_either_credential() -> None:
    policy = AccessPolicy(
        http_restricted=["model-repository:admin-key=header-secret"], admin_token=TOKEN
    )
    repo = ApiGroup.MODEL_REPOSITORY
    assert not denied(policy, "http", repo, {"admin-key": "header-secret"})
    assert not denied(policy, "http", repo, {"authorization": f"Bearer {TOKEN}"})
    message = denied(policy, "http", repo, {"admin-key": "wrong"})
    assert "header 'admin-key' (--http-restricted-api) or 'authorization: Bearer" in message
    assert "header-secret" not in message and TOKEN not in message
    # The token guards the admin groups on both protocols, and nothing else.
    for group in (ApiGroup.SHARED_MEMORY, ApiGroup.TRACE, ApiGroup.LOGGING):
        assert denied(policy, "grpc", group, {})
        assert not denied(policy, "grpc", group, {"authorization": f"Bearer {TOKEN}"})
    for group in (ApiGroup.INFERENCE, ApiGroup.HEALTH, ApiGroup.STATISTICS):
        assert not policy.guards("http", group) and not policy.guards("grpc", group)
        assert not denied(policy, "http", group, {})
    # The Triton-style header is per protocol: gRPC's repository API wants only the token.
    assert policy.headers("grpc", repo) == ["authorization"]
    assert denied(policy, "grpc", repo, {"admin-key": "header-secret"})


def test_grpc_restrictions_use_tritons_metadata_prefix() -> None:
    policy = AccessPolicy(grpc_restricted=["inference:infer-key=v1"])
    assert policy.headers("grpc", ApiGroup.INFERENCE) == ["triton-grpc-protocol-infer-key"]
    assert not denied(policy, "grpc", ApiGroup.INFERENCE, {"triton-grpc-protocol-infer-key": "v1"})
    assert denied(policy, "grpc", ApiGroup.INFERENCE, {"infer-key": "v1"})
    assert not policy.guards("http", ApiGroup.INFERENCE)
