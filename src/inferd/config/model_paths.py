"""Files a model config names (warm-up data, label files): always inside the model's directory.

A config can come from a client (load's `config` parameter), so a path in it is untrusted:
it must resolve, symbolic links followed, to a place inside the model's directory, or the
load fails. The refusal is decided before the file is looked at, so it reads the same
whether the file exists or not, and no error ever quotes a file's bytes.
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError


def confined(model_dir: Path, relative: str, base: str, field: str) -> Path:
    """`model_dir / base / relative`, when it stays inside `model_dir`; else ConfigError
    naming `field`. The file need not exist (the caller says if it must)."""
    start = f"{model_dir.name}/{base + '/' if base else ''}"
    outside = ConfigError(
        f"{field}: '{relative}' (relative to {start}) must name a file inside the model's "
        f"directory {model_dir.name}/"
    )
    if not relative or "\0" in relative:
        raise outside
    try:
        root = model_dir.resolve()
        path = (root / base / relative).resolve()
    except (OSError, RuntimeError):  # a symbolic-link loop, an unreadable component
        raise outside from None
    if root not in path.parents:
        raise outside
    return path


def check_config_paths(config: mc.ModelConfig, model_dir: Path) -> None:
    """Every file path the config names, checked at load, before any is read (warm-up data;
    `label_filename`, the labels of the classification extension)."""
    where = f"{model_dir.name}/config.pbtxt"
    for output in config.output:
        if output.label_filename:
            confined(
                model_dir,
                output.label_filename,
                "",
                f"{where}: output '{output.name}': label_filename",
            )
    for warmup in config.model_warmup:
        for name, spec in warmup.inputs.items():
            if spec.WhichOneof("input_data_type") == "input_data_file":
                field = f"{where}: model_warmup '{warmup.name}' input '{name}': input_data_file"
                confined(model_dir, spec.input_data_file, "warmup", field)
