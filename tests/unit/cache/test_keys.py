"""Cache keys: two requests differing in any one field never share a digest nor a
description; identical ones (input order aside) always do; normalisation is opt-in and does
exactly what it says."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from inferd.cache import KEY_EXEMPT_PARAMETERS, KeyOptions, UncacheableRequestError, cache_key
from inferd.datatypes import V2_TO_NUMPY
from inferd.types import RequestedOutput, SharedMemoryRef, Tensor

# Fixed-size datatypes by item size: a datatype swap keeps the very same bytes.
BY_ITEMSIZE = {
    1: ["INT8", "UINT8"],
    2: ["FP16", "BF16", "INT16", "UINT16"],
    4: ["FP32", "INT32", "UINT32"],
    8: ["FP64", "INT64", "UINT64"],
}
FIXED = [d for names in BY_ITEMSIZE.values() for d in names]


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    payload: bytes | tuple[bytes, ...]  # raw bytes, or BYTES elements

    def tensor(self) -> Tensor:
        if self.datatype == "BYTES":
            data = np.empty(len(self.payload), dtype=object)
            data[:] = list(self.payload)
        else:
            assert isinstance(self.payload, bytes)
            data = np.frombuffer(self.payload, dtype=V2_TO_NUMPY[self.datatype]).copy()
        return Tensor(self.name, self.datatype, self.shape, data.reshape(self.shape))


@dataclass(frozen=True)
class RequestSpec:
    model: str
    version: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...] | None
    parameters: dict[str, Any]

    def key(self, order: list[int] | None = None, options: KeyOptions | None = None):
        inputs = [self.inputs[i] for i in (order or range(len(self.inputs)))]
        outputs = None
        if self.outputs is not None:
            outputs = [RequestedOutput(name, dict(params)) for name, params in self.outputs]
        return cache_key(
            self.model,
            self.version,
            [spec.tensor() for spec in inputs],
            outputs,
            dict(self.parameters),
            options or KeyOptions(),
        )


def shapes_of(n: int) -> list[tuple[int, ...]]:
    return [(n,), (1, n), (n, 1)]


names = st.text(min_size=1, max_size=6)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.binary(max_size=5)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)
parameter_maps = st.dictionaries(
    names.filter(lambda n: n not in KEY_EXEMPT_PARAMETERS), values, max_size=3
)


@st.composite
def input_specs(draw: st.DrawFn, name: str) -> InputSpec:
    n = draw(st.integers(0, 5))
    shape = draw(st.sampled_from(shapes_of(n)))
    datatype = draw(st.sampled_from([*FIXED, "BYTES"]))
    if datatype == "BYTES":
        payload: bytes | tuple[bytes, ...] = tuple(
            draw(st.lists(st.binary(max_size=4), min_size=n, max_size=n))
        )
    else:
        size = n * V2_TO_NUMPY[datatype].itemsize
        payload = draw(st.binary(min_size=size, max_size=size))
    return InputSpec(name, datatype, shape, payload)


@st.composite
def requests(draw: st.DrawFn) -> RequestSpec:
    input_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    outputs = draw(st.none() | st.lists(st.tuples(names, parameter_maps), max_size=2).map(tuple))
    return RequestSpec(
        draw(names),
        draw(st.sampled_from(["", "1", "2"])),
        tuple(draw(input_specs(n)) for n in input_names),
        outputs,
        draw(parameter_maps),
    )


def typed(value: Any) -> Any:
    """An equality that sees types: 1, 1.0 and True differ, as in the key."""
    if isinstance(value, dict):
        return ("dict", sorted((typed(k), typed(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("list", [typed(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, repr(value))


def other_text(draw: st.DrawFn, old: str, taken: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    return draw(names.filter(lambda n: n != old and n not in taken))


@st.composite
def one_field_changed(draw: st.DrawFn) -> tuple[RequestSpec, RequestSpec, str]:
    base = draw(requests())
    fields = ["model", "version", "input", "parameter"]
    fields += ["output"] if base.outputs else ["outputs_given"]
    field = draw(st.sampled_from(fields))
    if field == "model":
        return base, replace(base, model=other_text(draw, base.model)), field
    if field == "version":
        version = draw(st.sampled_from(["", "1", "2", "3"]).filter(lambda v: v != base.version))
        return base, replace(base, version=version), field
    if field == "outputs_given":
        given: tuple[()] | None = () if base.outputs is None else None
        return base, replace(base, outputs=given), field
    if field == "parameter":
        params = dict(base.parameters)
        change_one: bool = bool(params) and draw(st.booleans())
        if change_one:
            name = draw(st.sampled_from(sorted(params)))
            params[name] = draw(values.filter(lambda v: typed(v) != typed(params[name])))
        else:
            params[other_text(draw, "", set(params) | KEY_EXEMPT_PARAMETERS)] = draw(values)
        return base, replace(base, parameters=params), field
    if field == "output":
        outputs: list[tuple[str, dict[str, Any]]] = list(base.outputs or ())
        i = draw(st.integers(0, len(outputs) - 1))
        name, output_params = outputs[i]
        if draw(st.booleans()):
            outputs[i] = (other_text(draw, name), output_params)
        else:
            new_params = dict(output_params)
            key = draw(names)
            old = new_params.get(key, object())
            new_params[key] = draw(values.filter(lambda v: typed(v) != typed(old)))
            outputs[i] = (name, new_params)
        return base, replace(base, outputs=tuple(outputs)), field
    # One input, one of its fields.
    inputs = list(base.inputs)
    i = draw(st.integers(0, len(inputs) - 1))
    spec = inputs[i]
    what = draw(st.sampled_from(["name", "datatype", "shape", "bytes"]))
    if what == "name":
        new = replace(spec, name=other_text(draw, spec.name, {s.name for s in inputs}))
    elif what == "shape":
        n = math.prod(spec.shape)
        new = replace(
            spec, shape=draw(st.sampled_from([s for s in shapes_of(n) if s != spec.shape]))
        )
    elif what == "datatype" and spec.datatype != "BYTES":
        same_size = BY_ITEMSIZE[V2_TO_NUMPY[spec.datatype].itemsize]
        new = replace(
            spec, datatype=draw(st.sampled_from([d for d in same_size if d != spec.datatype]))
        )
    elif spec.datatype == "BYTES":
        assert isinstance(spec.payload, tuple)
        elements: list[bytes] = list(spec.payload)
        assume(elements)
        j = draw(st.integers(0, len(elements) - 1))
        elements[j] = draw(st.binary(max_size=4).filter(lambda b: b != elements[j]))
        new = replace(spec, payload=tuple(elements))
    else:
        assert isinstance(spec.payload, bytes)
        assume(spec.payload)
        raw = bytearray(spec.payload)
        j = draw(st.integers(0, len(raw) - 1))
        raw[j] ^= draw(st.integers(1, 255))
        new = replace(spec, payload=bytes(raw))
    inputs[i] = new
    return base, replace(base, inputs=tuple(inputs)), f"input {what}"


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(one_field_changed())
def test_requests_differing_in_one_field_never_share_a_key(case):
    base, changed, field = case
    a, b = base.key(), changed.key()
    assert a.description != b.description, field
    assert a.digest != b.digest, field
    assert len(a.digest) >= 16


@settings(max_examples=200)
@given(requests(), st.randoms(use_true_random=False))
def test_identical_requests_share_a_key_whatever_the_input_order(spec, random):
    order = list(range(len(spec.inputs)))
    random.shuffle(order)
    assert spec.key() == spec.key(order)


@given(requests(), st.sampled_from(sorted(KEY_EXEMPT_PARAMETERS)), values)
def test_exempt_parameters_do_not_change_the_key(spec, name, value):
    assert replace(spec, parameters={**spec.parameters, name: value}).key() == spec.key()


def tensor(name: str, datatype: str, values: list[Any]) -> Tensor:
    if datatype == "BYTES":
        data = np.empty(len(values), dtype=object)
        data[:] = values
    else:
        data = np.array(values, dtype=V2_TO_NUMPY[datatype])
    return Tensor(name, datatype, (len(values),), data)


def key_of(*inputs: Tensor, parameters: dict[str, Any] | None = None, **options: Any):
    return cache_key("m", "1", list(inputs), None, parameters or {}, KeyOptions(**options))


def test_types_of_parameter_values_matter():
    keys = {
        key_of(tensor("x", "FP32", [1.0]), parameters={"p": v})
        for v in [1, 1.0, "1", True, b"1", [1], None]
    }
    assert len(keys) == 7


def test_bytes_elements_are_length_prefixed():
    assert key_of(tensor("x", "BYTES", [b"ab", b"c"])) != key_of(
        tensor("x", "BYTES", [b"a", b"bc"])
    )
    assert key_of(tensor("x", "BYTES", [b""])) != key_of(tensor("x", "BYTES", []))


def test_every_output_differs_from_none_requested_and_shared_memory_counts():
    x = [tensor("x", "FP32", [1.0])]
    every = cache_key("m", "1", x, None, {})
    none = cache_key("m", "1", x, [], {})
    region = RequestedOutput("y", shared_memory=SharedMemoryRef("r", 4))
    other_region = RequestedOutput("y", shared_memory=SharedMemoryRef("r", 4, 4))
    shm = cache_key("m", "1", x, [region], {})
    assert len({every, none, shm, cache_key("m", "1", x, [RequestedOutput("y")], {})}) == 4
    assert shm != cache_key("m", "1", x, [other_region], {})


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
def test_float_rounding_maps_near_values_together_only_when_asked(datatype):
    near = tensor("x", datatype, [1.00001]), tensor("x", datatype, [1.00002])
    far = tensor("x", datatype, [1.001]), tensor("x", datatype, [1.002])
    if datatype in ("FP32", "FP64"):  # FP16 / BF16 cannot even tell the near ones apart
        assert key_of(near[0]) != key_of(near[1])
    assert key_of(near[0], float_decimals=3) == key_of(near[1], float_decimals=3)
    if datatype != "BF16":  # 1.001 and 1.002 are one BF16 value
        assert key_of(far[0], float_decimals=3) != key_of(far[1], float_decimals=3)


def test_rounding_hashes_minus_zero_as_zero_and_leaves_other_types_alone():
    assert key_of(tensor("x", "FP32", [-0.0001]), float_decimals=3) == key_of(
        tensor("x", "FP32", [0.0]), float_decimals=3
    )
    assert key_of(tensor("x", "FP32", [-0.0])) != key_of(tensor("x", "FP32", [0.0]))
    ints = tensor("x", "INT32", [1]), tensor("x", "INT32", [2])
    assert key_of(ints[0], float_decimals=0) != key_of(ints[1], float_decimals=0)


def test_rounding_leaves_the_inputs_as_sent():
    x = tensor("x", "FP32", [1.23456])
    key_of(x, float_decimals=1)
    assert x.data[0] == np.float32(1.23456)


@pytest.mark.parametrize(
    ("step", "a", "b", "not_merged"),
    [
        ("strip", b"  hi\n", b"hi", (b"HI", b"hi")),
        ("space", b"a \t  b\nc", b"a b c", (b"A b", b"a b")),
        ("lower", b"HeLLo", b"hello", (b" hello", b"hello")),
        ("nfc", "e\u0301".encode(), "\u00e9".encode(), (b"E", b"e")),
    ],
)
def test_each_text_normalisation_does_exactly_its_step(step, a, b, not_merged):
    assert key_of(tensor("t", "BYTES", [a])) != key_of(tensor("t", "BYTES", [b]))
    assert key_of(tensor("t", "BYTES", [a]), text_normalize=(step,)) == key_of(
        tensor("t", "BYTES", [b]), text_normalize=(step,)
    )
    # ...and nothing else: what another step would merge stays apart.
    x, y = not_merged
    assert key_of(tensor("t", "BYTES", [x]), text_normalize=(step,)) != key_of(
        tensor("t", "BYTES", [y]), text_normalize=(step,)
    )


def test_text_normalisation_steps_combine_and_spare_what_is_not_utf8():
    steps = ("nfc", "lower", "strip")
    assert key_of(tensor("t", "BYTES", [" E\u0301 ".encode()]), text_normalize=steps) == key_of(
        tensor("t", "BYTES", ["\u00e9".encode()]), text_normalize=steps
    )
    assert key_of(tensor("t", "BYTES", [b" \xff"]), text_normalize=steps) != key_of(
        tensor("t", "BYTES", [b"\xff"]), text_normalize=steps
    )


def test_options_are_part_of_the_key():
    x = tensor("x", "FP32", [1.0])
    assert len({key_of(x), key_of(x, float_decimals=3), key_of(x, text_normalize=("lower",))}) == 3


def test_bad_options_and_unencodable_parameters_are_refused():
    with pytest.raises(ValueError, match="float_decimals"):
        KeyOptions(float_decimals=16)
    with pytest.raises(ValueError, match="'upper'.*strip, space, lower, nfc"):
        KeyOptions(text_normalize=("upper",))
    with pytest.raises(UncacheableRequestError, match="object"):
        key_of(tensor("x", "FP32", [1.0]), parameters={"p": object()})


def test_numpy_parameter_values_have_their_own_encoding():
    x = tensor("x", "FP32", [1.0])
    assert key_of(x, parameters={"p": np.int64(3)}) == key_of(x, parameters={"p": 3})
    a, b = np.zeros(2000), np.zeros(2000)
    b[1000] = 1  # same repr ('...'), different content
    assert key_of(x, parameters={"p": a}) != key_of(x, parameters={"p": b})


def test_mappings_have_one_encoding_whatever_their_type_and_order():
    from types import MappingProxyType

    x = tensor("x", "FP32", [1.0])
    forward = {"b": 1, 2: "two", (1, 2): None, "a": [1.0]}
    backward = dict(reversed(list(forward.items())))
    assert key_of(x, parameters={"p": forward}) == key_of(x, parameters={"p": backward})
    assert key_of(x, parameters={"p": MappingProxyType(forward)}) == key_of(
        x, parameters={"p": forward}
    )
    strings = {"b": 1, "a": 2}
    assert key_of(x, parameters={"p": MappingProxyType(strings)}) == key_of(
        x, parameters={"p": dict(reversed(list(strings.items())))}
    )
    # A key's type counts like a value's: 1, "1" and True are three entries' worth.
    assert len({key_of(x, parameters={"p": {k: 0}}) for k in (1, "1", True, 1.0)}) == 4


def test_data_of_another_dtype_is_keyed_as_its_datatype_says():
    as_f64 = Tensor("x", "FP32", (2,), np.array([1.5, 2.0], dtype=np.float64))
    big_endian = Tensor("x", "FP32", (2,), np.array([1.5, 2.0], dtype=">f4"))
    assert key_of(as_f64) == key_of(tensor("x", "FP32", [1.5, 2.0])) == key_of(big_endian)


def test_str_elements_of_bytes_tensors_are_keyed_and_normalised_apart_from_bytes():
    as_str = tensor("t", "BYTES", [" Ab"])
    assert key_of(as_str) != key_of(tensor("t", "BYTES", [b" Ab"]))
    assert key_of(as_str, text_normalize=("strip", "lower")) == key_of(
        tensor("t", "BYTES", ["ab"]), text_normalize=("strip", "lower")
    )
