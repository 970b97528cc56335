"""The rules inferd's Dockerfile keeps (docs/deploy.md), checked without a container
engine: a pinned base, several stages, no compilers in the final one, a non-root user,
tini as PID 1, a HEALTHCHECK on readiness, Triton's ports and /models.

A small reader for the subset of the Dockerfile syntax the file uses: line continuations,
comments, ARG defaults, FROM ... AS name, and exec-form (JSON) ENTRYPOINT and CMD.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

COMPILERS = {
    "build-essential", "gcc", "g++", "cc", "c++", "clang", "make", "cmake", "gfortran",
    "cpp", "libc6-dev", "python3-dev", "rustc", "cargo",
}  # fmt: skip
PORTS = {"8000", "8001", "8002"}  # HTTP, gRPC, metrics: Triton's
# An exact version in the tag (3.11.13, 3.11.13-slim-bookworm), or a digest.
PINNED = re.compile(
    r"^[^@\s]+:(\d+\.\d+\.\d+)[^@\s]*(@sha256:[0-9a-f]{64})?$|@sha256:[0-9a-f]{64}$"
)


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    image: str  # as written after FROM, ARGs expanded
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    return out


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults, and the stages in order."""
    args: dict[str, str] = {}
    found: list[Stage] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            words = ins.args.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], ""), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ""
            found.append(Stage(image, name))
        elif found:
            found[-1].instructions.append(ins)
        elif ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            args[name.strip()] = default.strip().strip('"')
    return args, found


def _installed_packages(run: str) -> set[str]:
    """Package names after `apt-get install` / `apk add` / `pip install` in a RUN."""
    words = shlex.split(run.replace(";", " ; ").replace("&&", " ; "))
    packages: set[str] = set()
    installing = False
    for i, word in enumerate(words):
        if word == ";":
            installing = False
        elif word in ("install", "add") and i and words[i - 1] in ("apt-get", "apt", "apk"):
            installing = True
        elif installing and not word.startswith("-") and not word.startswith("$"):
            packages.add(word)
    return packages


def violations(text: str) -> list[str]:
    """What breaks the rules, one line each; [] when the Dockerfile keeps them all."""
    problems: list[str] = []
    args, found = stages(text)
    if len(found) < 2:
        problems.append("not multi-stage: build in one stage, run in another")
    for stage in found:
        if stage.image.endswith(":latest") or ":" not in stage.image.split("/")[-1]:
            if not any(stage.image == s.name for s in found):
                problems.append(f"FROM {stage.image}: 'latest' or no tag; pin an exact tag")
        elif not PINNED.search(stage.image) and not any(stage.image == s.name for s in found):
            problems.append(f"FROM {stage.image}: not pinned to an exact version or digest")
    if not found:
        return problems
    final = found[-1]
    for run in final.all("RUN"):
        compilers = _installed_packages(run.args) & COMPILERS
        if compilers:
            problems.append(f"line {run.line}: the final stage installs {sorted(compilers)}")
    if not any("--from=" in c.args for c in final.all("COPY")):
        problems.append("the final stage copies nothing from a build stage")
    users = final.all("USER")
    if not users:
        problems.append("no USER in the final stage: it runs as root")
    else:
        user = users[-1].args.split(":")[0]
        if user in ("root", "0"):
            problems.append(f"line {users[-1].line}: USER {user} is root")
        runs = final.all("RUN")
        if runs and runs[-1].line > users[-1].line:
            problems.append(
                f"line {runs[-1].line}: a RUN after USER runs as the user (keep it before)"
            )
    checks = final.all("HEALTHCHECK")
    if not checks or "/v2/health/ready" not in checks[-1].args:
        problems.append("no HEALTHCHECK on /v2/health/ready in the final stage")
    entry = final.all("ENTRYPOINT")
    try:
        argv = json.loads(entry[-1].args) if entry else []
    except json.JSONDecodeError:
        argv = []
        problems.append("ENTRYPOINT is not in exec (JSON) form: signals would go to a shell")
    if not argv or argv[0].split("/")[-1] not in ("tini", "tini-static", "dumb-init"):
        problems.append("the ENTRYPOINT does not start tini (PID 1 must forward SIGTERM)")
    exposed = {p.split("/")[0] for e in final.all("EXPOSE") for p in e.args.split()}
    if not exposed >= PORTS:
        problems.append(f"EXPOSE lacks {sorted(PORTS - exposed)}")
    env = " ".join(e.args for e in final.all("ENV"))
    if "INFERD_MODEL_REPOSITORY=/models" not in env:
        problems.append("the model repository is not /models (ENV INFERD_MODEL_REPOSITORY)")
    if "BASE_IMAGE" in args and not PINNED.search(args["BASE_IMAGE"]):
        problems.append(f"ARG BASE_IMAGE={args['BASE_IMAGE']}: not pinned")
    return problems
