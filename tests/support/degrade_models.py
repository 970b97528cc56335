"""Models for the degradation tiers' tests: a primary whose latency the test sets while the
server runs (a file of milliseconds, read at every execution: `60` or a cycle `130,160`),
and a light fallback. Each answers IN plus its own offset, so an answer says who made it."""

from __future__ import annotations

import textwrap
from pathlib import Path

TIMED_PY = """
import itertools, time
from pathlib import Path

class Model:
    def load(self, context):
        self.delays = Path(context.parameters["delay_file"].format(version=context.version))
        self.offset = float(context.parameters.get("offset", "0"))
        self.executions = itertools.count()

    def predict(self, inputs):
        text = self.delays.read_text().strip() if self.delays.exists() else "0"
        cycle = [float(v) for v in text.split(",")]
        n = next(self.executions)
        time.sleep(cycle[n % len(cycle)] / 1000)
        return {"OUT": inputs["IN"] + self.offset}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "delay_file" value: {{ string_value: "{delay_file}" }} }}
parameters {{ key: "offset" value: {{ string_value: "{offset}" }} }}
{extra}
"""

PRIMARY_OFFSET = 1.0
FALLBACK_OFFSET = 100.0


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'


class Delays:
    """Where a timed model's versions read their latency: `set("60")`, `set("130,160", "2")`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, version: str = "1") -> Path:
        return self.folder / f"delay_{version}"

    def set(self, milliseconds: str, version: str = "1") -> None:
        # Replaced in one rename: an execution never reads a half-written file.
        tmp = self.folder / f".delay_{version}.tmp"
        tmp.write_text(milliseconds)
        tmp.replace(self.path(version))


def write_timed_model(
    repo: Path, name: str, offset: float, extra: str = "", versions: tuple[int, ...] = (1,)
) -> Delays:
    """The model, and where its latency is set (outside the repository: writing it is no
    change to the model's files)."""
    model_dir = repo / name
    delays = Delays(repo.parent / f"{repo.name}-delays" / name)
    delays.folder.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
        (model_dir / str(version) / "model.py").write_text(textwrap.dedent(TIMED_PY))
        delays.set("0", str(version))
    template = str(delays.folder / "delay_{version}")
    (model_dir / "config.pbtxt").write_text(
        CONFIG.format(name=name, delay_file=template, offset=offset, extra=extra)
    )
    return delays


def degrade(tiers: str, **more: str) -> str:
    """The tiers' parameters: `degrade_p99_ms` and any degrade_<key> given."""
    lines = [param("degrade_p99_ms", tiers)]
    lines += [param(f"degrade_{key}", value) for key, value in more.items()]
    return "\n".join(lines)
