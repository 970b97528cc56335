"""Which request parameters a Python model sees, and which values it can be given."""

from __future__ import annotations

import pytest

from inferd.errors import ErrorKind, InferdError
from inferd.tensors.request_parameters import model_parameters


def test_tritons_reserved_keys_stay_with_the_server() -> None:
    sent = {
        "mode": "fast",
        "n": 3,
        "ratio": 0.5,
        "flag": False,
        "priority": 1,
        "timeout": 2000,
        "sequence_id": 7,
        "sequence_start": True,
        "sequence_end": False,
        "headers": "x",
        "binary_data_output": True,
        "triton_enable_empty_final_response": True,
    }
    assert model_parameters(sent) == ({"mode": "fast", "n": 3, "ratio": 0.5, "flag": False}, 2000)


@pytest.mark.parametrize("timeout", [-5, "100", True, 1.5])
def test_a_malformed_timeout_is_not_the_models_timeout(timeout: object) -> None:
    # The scheduler's own check refuses it (dataplane); the model never sees it.
    assert model_parameters({"timeout": timeout}) == ({}, 0)


@pytest.mark.parametrize(("value", "named"), [([1, 2], "list"), ({"a": 1}, "dict"), (None, "null")])
def test_a_value_no_model_can_take_is_invalid_naming_the_parameter(
    value: object, named: str
) -> None:
    with pytest.raises(InferdError) as info:
        model_parameters({"ok": 1, "shape_hint": value})
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "request parameter 'shape_hint'" in info.value.message
    assert f"got {named}" in info.value.message


def test_the_degradation_opt_out_is_the_servers_and_must_be_a_boolean() -> None:
    assert model_parameters({"inferd_degrade": False, "n": 1}) == ({"n": 1}, 0)
    with pytest.raises(InferdError) as info:
        model_parameters({"inferd_degrade": "no"})
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "request parameter 'inferd_degrade' must be a boolean" in info.value.message
