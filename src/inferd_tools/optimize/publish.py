"""Publish the winner as the model's next version: `<model>/<N+1>/<model file>` with the
report beside it, staged in a hidden folder of the repository and renamed into place, so a
polling server never sees half a version. The config is the model's own, carried over."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.public import checksum
from inferd_tools.optimize.candidates import Built
from inferd_tools.optimize.errors import OptimizeError, PublishError
from inferd_tools.optimize.source import MODEL_FILE, OriginalModel

REPORT_FILE = "optimize_report.json"
AUTO_ROLLBACK = "canary_auto_rollback"


@dataclass
class Published:
    version: int
    directory: Path
    model_sha256: str
    checksum: str  # the version's checksum as the server shows it (parameter model_checksum)
    policy_note: str  # "" when the version policy serves the new version

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "directory": str(self.directory),
            "model_sha256": self.model_sha256,
            "checksum": self.checksum,
            "policy_note": self.policy_note,
        }


def served_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """Triton's version_policy: latest (default 1), all, or specific."""
    policy = config.version_policy
    if policy.HasField("all"):
        return available
    if policy.HasField("specific"):
        wanted = {int(v) for v in policy.specific.versions}
        return [v for v in available if v in wanted]
    num = policy.latest.num_versions if policy.HasField("latest") else 1
    return available[-num:] if num > 0 else []


def policy_note(model: OriginalModel) -> str:
    new = model.next_version
    if new in served_versions(model.config, [*model.versions, new]):
        return ""
    return (
        f"{model.name}/config.pbtxt: the version_policy does not serve version {new}, so "
        "the server will not load it until the policy names it"
    )


def check_canary_possible(model: OriginalModel) -> None:
    """A canary splits traffic between the optimised version and the new one: both must be
    served, and the automatic rollback must watch the canary. Checked before any work."""
    where = f"{model.name}/config.pbtxt"
    new = model.next_version
    served = served_versions(model.config, [*model.versions, new])
    missing = [v for v in (model.version, new) if v not in served]
    if missing:
        raise OptimizeError(
            f"--canary: {where}'s version_policy would not serve version "
            f"{' and '.join(map(str, missing))} beside the other once {new} is published; "
            "serve both, e.g. version_policy: { latest { num_versions: 2 } }"
        )
    if model.config.parameters[AUTO_ROLLBACK].string_value.lower() not in ("true", "1"):
        raise OptimizeError(
            f"--canary: {where} does not turn on the automatic rollback; add "
            f'parameters {{ key: "{AUTO_ROLLBACK}" value: {{ string_value: "true" }} }} '
            "(docs/lifecycle.md)"
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def publish(model: OriginalModel, winner: Built, report: dict[str, Any]) -> Published:
    version = model.next_version
    target = model.model_dir / str(version)
    if target.exists():
        raise PublishError(f"{target} exists already: another version was published meanwhile")
    model_file = MODEL_FILE[winner.format]
    # A hidden folder of the repository: the server skips it, and the rename stays on one
    # file system, so the version appears whole.
    staging = Path(tempfile.mkdtemp(prefix=f".inferd-optimize-{model.name}-", dir=model.repository))
    try:
        shutil.copyfile(winner.path, staging / model_file)
        sha = file_sha256(staging / model_file)
        beside = dict(report)
        beside["published"] = {"version": version, "model_file": model_file, "model_sha256": sha}
        (staging / REPORT_FILE).write_text(json.dumps(beside, indent=2) + "\n", encoding="utf-8")
        digest = checksum(staging)  # relative paths: the same once renamed
        os.chmod(staging, 0o755)  # mkdtemp makes it private; a version is readable like others
        staging.rename(target)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise PublishError(f"cannot write {target}: {e}") from None
    return Published(version, target, sha, digest, policy_note(model))
