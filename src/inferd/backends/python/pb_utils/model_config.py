"""`pb_utils.ModelConfig`: what `TritonPythonModel.auto_complete_config` receives and returns.

It wraps the model's config as Triton's JSON (the form `GET /v2/models/<m>/config` shows) and
lets the model fill in `max_batch_size`, `input`, `output`, `dynamic_batching` and
`model_transaction_policy`, refusing (ValueError, as Triton) what contradicts the config
file. The loader turns the result back into the config it validates and serves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_INPUT_PROPERTIES = ("name", "data_type", "dims", "optional")
_OUTPUT_PROPERTIES = ("name", "data_type", "dims")


class ModelConfig:
    def __init__(self, model_config: str | Mapping[str, Any]) -> None:
        doc = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        doc.setdefault("input", [])
        doc.setdefault("output", [])
        doc.setdefault("max_batch_size", 0)
        self._model_config: dict[str, Any] = doc

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        """The config as a dict (read it; change it through the set_/add_ methods)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Make dynamic batching the scheduler, unless another scheduler is set."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:  # noqa: A002 (Triton's name)
        self._add("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output, _OUTPUT_PROPERTIES)

    def _add(self, kind: str, tensor: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        label = str(tensor.get("name", ""))
        where = f"{kind} '{label}' in auto-complete-config function for model '{self._name}'"
        extra = [p for p in tensor if p not in allowed]
        if extra:
            raise ValueError(
                f"{where} contains property other than {', '.join(repr(p) for p in allowed)}: "
                f"{', '.join(map(str, extra))}"
            )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name}' is missing "
                "'name' property."
            )
        for needed in ("data_type", "dims"):
            if needed not in tensor:
                raise ValueError(f"{where} is missing '{needed}' property.")
        for current in self._model_config[kind]:
            if current.get("name") != label:
                continue
            declared = current.get("data_type", "TYPE_INVALID")
            if declared != "TYPE_INVALID" and declared != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{declared} for {kind} '{label}', model provides {tensor['data_type']}"
                )
            dims = [int(d) for d in current.get("dims", [])]
            if dims and dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name}', tensor '{label}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims {dims}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and bool(current["optional"]) != bool(tensor["optional"])
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{label}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current.update(tensor)
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        extra = [p for p in transaction_policy_dict if p != "decoupled"]
        if extra:
            raise ValueError(
                f"model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
