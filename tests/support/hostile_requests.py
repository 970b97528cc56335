"""The hostile-input tests' vocabulary: every datatype, shapes gRPC can carry, JSON bodies and
request-like values that are not requests."""

from __future__ import annotations

from hypothesis import strategies as st

DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
    "",
    "fp32",
    "STRING",
]


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)


KEYS = st.sampled_from(
    [
        "inputs",
        "outputs",
        "name",
        "datatype",
        "shape",
        "data",
        "parameters",
        "id",
        "binary_data_size",
        "binary_data",
        "binary_data_output",
        "INPUT0",
        "input",
    ]
) | st.text(max_size=4)


JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=24,
)


# Documents that look like requests, so the fuzz reaches past the first checks.
REQUESTISH = st.fixed_dictionaries(
    {"inputs": st.lists(st.dictionaries(KEYS, JSON, max_size=5), min_size=1, max_size=2)},
    optional={"outputs": JSON, "parameters": JSON, "id": JSON},
)


GRPC_DIMS = st.one_of(
    st.integers(min_value=-2, max_value=6),
    st.sampled_from([2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]),
)
