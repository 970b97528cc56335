"""`inferd optimize`: the command's options, and from them to a report and a published
version (or a refusal), with the exit codes of docs/optimize.md."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from inferd.public import DefaultsOnceFormatter

# Everything heavy (onnxruntime's quantisers, torch) is imported only when the command
# runs: building the parser must stay cheap, since every `inferd` command builds it.


def add_optimize_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "optimize",
        help="build lighter variants of a model (INT8, FP16, graph), measure speed and "
        "accuracy, publish the winner as the next version",
        description="Build each candidate of an ONNX or PyTorch model (--try), measure it in "
        "process with the model's instance settings (latency at batch 1, the preferred batch "
        "and max_batch_size, throughput, size, load time) and its accuracy against the "
        "original's outputs (and --labels), and pick the fastest eligible one: at least "
        "--min-speedup faster and within --max-accuracy-drop. With --publish it becomes the "
        "model's next version. Exit codes: 0 a winner (published if asked), 1 publishing or "
        "the server step failed, 2 bad input, 3 no eligible candidate. See docs/optimize.md.",
        formatter_class=DefaultsOnceFormatter,
    )
    p.add_argument("-m", "--model", required=True, help="the model to optimise")
    p.add_argument(
        "--model-repository",
        type=Path,
        required=True,
        metavar="DIR",
        help="the repository holding the model (Triton's layout); --publish writes into it",
    )
    p.add_argument(
        "--version", type=int, default=None, help="the version to optimise (default: the latest)"
    )
    p.add_argument(
        "--try",
        dest="tries",
        default=None,
        metavar="LIST",
        help="candidates: graph, int8-dynamic, int8-static, fp16 (ONNX models; all by "
        "default), int8-dynamic, onnx-export (PyTorch models; both by default)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help=".npz, one array per input (samples first), calibrating int8-static "
        "(default: synthetic inputs)",
    )
    p.add_argument(
        "--validation",
        type=Path,
        default=None,
        metavar="FILE",
        help=".npz like --calibration: the samples accuracy is measured on (default: "
        "synthetic inputs, compared with the original's outputs only)",
    )
    p.add_argument(
        "--labels",
        type=Path,
        default=None,
        metavar="FILE",
        help=".npy (or one-array .npz): the class of each --validation sample; the drop is "
        "then the label accuracy lost",
    )
    p.add_argument(
        "--class-output",
        action="append",
        default=[],
        metavar="NAME",
        help="an output holding class scores (repeatable; default: the config's "
        "label_filename outputs and outputs that are probabilities)",
    )
    p.add_argument(
        "--embedding-output",
        action="append",
        default=[],
        metavar="NAME",
        help="an output holding one embedding vector per sample, judged by cosine similarity "
        "and nearest-neighbour agreement (repeatable; default: float outputs whose every "
        "vector has unit L2 length)",
    )
    p.add_argument(
        "--max-accuracy-drop",
        default="1%",
        metavar="X",
        help="largest accuracy drop a candidate may have: a share (0.01) or a percentage (1%%)",
    )
    p.add_argument(
        "--min-cosine",
        type=float,
        default=None,
        metavar="C",
        help="embedding outputs: least cosine similarity of any validation sample's vector to "
        "the original's (default: 0.99)",
    )
    p.add_argument(
        "--min-neighbour-agreement",
        default=None,
        metavar="S",
        help="embedding outputs: least share of validation samples whose nearest neighbour "
        "among the others stays the original's, a share (0.95) or a percentage (95%%) "
        "(default: 95%%)",
    )
    p.add_argument(
        "--min-speedup",
        type=float,
        default=1.1,
        metavar="Y",
        help="least speed-up (original p50 / candidate p50 at the preferred batch); 0 "
        "accepts any speed",
    )
    p.add_argument(
        "--publish", action="store_true", help="write the winner as the model's next version"
    )
    p.add_argument(
        "--canary",
        type=int,
        default=None,
        metavar="PERCENT",
        help="with --publish and --server: route this share of traffic to the new version",
    )
    p.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="the server's HTTP address: after --publish, wait until it serves the new "
        "version (with the recorded checksum), then set the --canary weights",
    )
    p.add_argument(
        "--wait-s",
        type=float,
        default=120.0,
        help="how long to wait for the server to serve the published version",
    )
    p.add_argument(
        "--duration-s", type=float, default=2.0, help="seconds timed per candidate and batch size"
    )
    p.add_argument(
        "--samples",
        type=int,
        default=256,
        help="synthetic samples, where no --validation or --calibration file is given",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic inputs")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the report")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="PNG of latency against accuracy drop (needs matplotlib: the 'bench' extra)",
    )


@dataclass(frozen=True)
class Options:
    repository: Path
    model: str
    version: int | None
    tries: list[str] | None
    calibration: Path | None
    validation: Path | None
    labels: Path | None
    class_outputs: list[str]
    embedding_outputs: list[str]
    max_accuracy_drop: float
    # None: not given (the rules' default applies, and no embedding output is required)
    min_cosine: float | None
    min_neighbour_agreement: float | None
    min_speedup: float
    publish: bool
    canary: int | None
    server: str | None
    wait_s: float
    duration_s: float
    samples: int
    seed: int
    json: Path | None
    plot: Path | None


def parse_share(text: str, option: str = "--max-accuracy-drop", example: str = "1%") -> float:
    from inferd_tools.optimize.errors import OptimizeError

    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise OptimizeError(
            f"{option} {text!r}: expected a share in [0, 1] or a percentage, e.g. {example}"
        )
    return value


def options_from_args(args: argparse.Namespace) -> Options:
    from inferd_tools.optimize.candidates import KINDS
    from inferd_tools.optimize.errors import OptimizeError

    tries = None
    if args.tries is not None:
        tries = [t.strip() for t in args.tries.split(",") if t.strip()]
        unknown = [t for t in tries if t not in KINDS]
        if unknown or not tries:
            raise OptimizeError(
                f"--try {args.tries!r}: unknown candidate {unknown[0] if unknown else '(none)'}; "
                f"choose from {', '.join(KINDS)}"
            )
        tries = list(dict.fromkeys(tries))
    if args.labels is not None and args.validation is None:
        raise OptimizeError("--labels needs --validation: the samples the labels belong to")
    if args.canary is not None:
        if not args.publish or not args.server:
            raise OptimizeError("--canary needs --publish and --server (the server to route)")
        if not 1 <= args.canary <= 99:
            raise OptimizeError(f"--canary {args.canary}: expected a percentage from 1 to 99")
    if args.min_speedup < 0:
        raise OptimizeError("--min-speedup must not be negative")
    both = sorted(set(args.class_output) & set(args.embedding_output))
    if both:
        raise OptimizeError(
            f"--embedding-output {both[0]}: also given as --class-output; an output is one kind"
        )
    if args.min_cosine is not None and not -1 <= args.min_cosine <= 1:
        raise OptimizeError(
            f"--min-cosine {args.min_cosine:g}: expected a cosine similarity in [-1, 1], e.g. 0.99"
        )
    agreement = None
    if args.min_neighbour_agreement is not None:
        agreement = parse_share(args.min_neighbour_agreement, "--min-neighbour-agreement", "95%")
    if args.duration_s <= 0 or args.samples < 1 or args.wait_s <= 0:
        raise OptimizeError("--duration-s, --samples and --wait-s must be positive")
    return Options(
        repository=args.model_repository,
        model=args.model,
        version=args.version,
        tries=tries,
        calibration=args.calibration,
        validation=args.validation,
        labels=args.labels,
        class_outputs=list(dict.fromkeys(args.class_output)),
        embedding_outputs=list(dict.fromkeys(args.embedding_output)),
        max_accuracy_drop=parse_share(args.max_accuracy_drop),
        min_cosine=args.min_cosine,
        min_neighbour_agreement=agreement,
        min_speedup=args.min_speedup,
        publish=args.publish,
        canary=args.canary,
        server=args.server,
        wait_s=args.wait_s,
        duration_s=args.duration_s,
        samples=args.samples,
        seed=args.seed,
        json=args.json,
        plot=args.plot,
    )


def main(args: argparse.Namespace) -> int:
    from inferd_tools.optimize.errors import EXIT_BAD_INPUT, OptimizeError
    from inferd_tools.optimize.run import run

    try:
        return run(options_from_args(args))
    except OptimizeError as e:
        print(f"inferd optimize: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\ninferd optimize: interrupted", file=sys.stderr)
        return 130
