"""One optimisation run: the original and each candidate built, measured and judged, the
report written, and the winner published (with the server step) or refused."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from inferd_tools.optimize import accuracy as acc
from inferd_tools.optimize.candidates import DEFAULT_TRIES, INT8_STATIC, CandidateError, build
from inferd_tools.optimize.data import (
    SYNTHETIC_INT_HIGH,
    Dataset,
    integer_inputs,
    load_inputs,
    load_labels,
    synthetic_inputs,
)
from inferd_tools.optimize.errors import (
    EXIT_NO_WINNER,
    EXIT_OK,
    EXIT_PUBLISH_FAILED,
    OptimizeError,
    PublishError,
)
from inferd_tools.optimize.measure import MeasureSettings, Speed, measure
from inferd_tools.optimize.publish import check_canary_possible, publish
from inferd_tools.optimize.report import (
    Report,
    check_plot_available,
    table,
    to_json,
    write_json,
    write_plot,
)
from inferd_tools.optimize.runners import open_runner
from inferd_tools.optimize.server_api import ServerApi
from inferd_tools.optimize.source import OriginalModel, check_installed, open_model
from inferd_tools.optimize.verdict import FAILED, MEASURED, Outcome, Rules, judge, pick_winner

if TYPE_CHECKING:
    from inferd_tools.optimize.main import Options


class Progress:
    """One line per step on stderr, `[k/n] candidate: what it is doing`."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.index = 0
        self.name = ""
        self.stream = stream or sys.stderr

    def start(self, name: str) -> None:
        self.index += 1
        self.name = name

    def __call__(self, message: str) -> None:
        print(f"[{self.index}/{self.total}] {self.name}: {message}", file=self.stream, flush=True)


class Evaluation:
    """What every candidate is compared with: the original's speed and outputs."""

    def __init__(
        self, model: OriginalModel, validation: Dataset, labels: np.ndarray | None, options: Options
    ) -> None:
        self.model = model
        self.validation = validation
        self.labels = labels
        self.options = options
        self.class_outputs = options.class_outputs
        self.settings = MeasureSettings(duration_s=options.duration_s)
        self.feeds = {b: validation.feed(b, model.batched) for b in model.batch_sizes()}
        self.reference: dict[str, np.ndarray] = {}
        self.kinds: dict[str, str] = {}
        self.label_output = ""
        self.original_label_accuracy: float | None = None

    def original(self, progress: Progress) -> Speed:
        model = self.model
        try:
            progress("loading")
            runner = open_runner(model.model_file, model.format, model)
            progress(f"running {self.validation.rows} validation samples")
            self.reference = acc.collect(runner, model, self.validation)
        except Exception as e:  # the model's own runtime error: the user's model is at fault
            raise OptimizeError(f"{model.model_file}: the original model does not run: {e}") from e
        self.kinds = acc.output_kinds(
            model, self.reference, self.class_outputs, self.options.embedding_outputs
        )
        self._check_embedding_basis()
        if self.labels is not None:
            self.label_output = acc.label_output(self.kinds, self.class_outputs)
            self.original_label_accuracy = acc.label_accuracy(
                self.reference, self.label_output, self.labels
            )
        try:
            return measure(runner, model.model_file, self.feeds, self.settings, progress)
        except Exception as e:  # as above: the timing feeds are the validation rows
            raise OptimizeError(f"{model.model_file}: the original model does not run: {e}") from e

    def _check_embedding_basis(self) -> None:
        """Embeddings are judged on real samples only, and their limits only given for them."""
        model, options = self.model, self.options
        embeddings = [name for name, kind in self.kinds.items() if kind == acc.EMBEDDING]
        if not embeddings:
            for option, value in (
                ("--min-cosine", options.min_cosine),
                ("--min-neighbour-agreement", options.min_neighbour_agreement),
            ):
                if value is not None:
                    kinds = ", ".join(f"{name} ({kind})" for name, kind in self.kinds.items())
                    raise OptimizeError(
                        f"{option}: {model.name} has no embedding output (outputs: {kinds}); "
                        "name one with --embedding-output"
                    )
            return
        integers = integer_inputs(model)
        if self.validation.synthetic and integers:
            raise OptimizeError(
                f"{model.name}: output '{embeddings[0]}' is an embedding and input "
                f"'{integers[0]}' holds integers (token ids?): random ids are not sentences, "
                "so candidates would be judged on meaningless samples; give --validation (and "
                "--calibration): a .npz of the tokenised sentences, padded (docs/optimize.md, "
                "Embedding models)"
            )
        if self.validation.rows < 2:
            option = "--samples" if self.validation.synthetic else "--validation"
            raise OptimizeError(
                f"{option}: {self.validation.rows} sample; the nearest-neighbour agreement "
                f"of embedding '{embeddings[0]}' needs at least 2"
            )

    def candidate(self, outcome: Outcome, progress: Progress) -> None:
        assert outcome.built is not None
        built = outcome.built
        try:
            progress("loading")
            runner = open_runner(built.path, built.format, self.model)
            progress(f"running {self.validation.rows} validation samples")
            outputs = acc.collect(runner, self.model, self.validation)
            agreement = acc.compare(self.reference, outputs, self.kinds)
            outcome.speed = measure(runner, built.path, self.feeds, self.settings, progress)
        except acc.OutputsDifferError as e:
            outcome.status, outcome.reason = FAILED, f"its outputs differ: {e}"
            return
        except Exception as e:  # a candidate that builds but does not run: report it, skip
            first = (str(e).strip().splitlines() or [""])[0]
            outcome.status, outcome.reason = FAILED, f"does not run: {type(e).__name__}: {first}"
            return
        outcome.accuracy = acc.Accuracy(agreement)
        if self.labels is not None:
            outcome.accuracy.label_accuracy = acc.label_accuracy(
                outputs, self.label_output, self.labels
            )
            outcome.accuracy.original_label_accuracy = self.original_label_accuracy
        outcome.status = MEASURED


def _datasets(
    model: OriginalModel, options: Options, tries: list[str]
) -> tuple[Dataset, Dataset, np.ndarray | None, dict[str, str]]:
    notes: dict[str, str] = {}
    if options.validation is not None:
        validation = load_inputs(options.validation, "--validation", model)
    else:
        validation = synthetic_inputs(model, options.samples, options.seed)
    if options.calibration is not None:
        calibration = load_inputs(options.calibration, "--calibration", model)
    else:
        try:
            calibration = synthetic_inputs(model, options.samples, options.seed + 1)
        except OptimizeError:
            if INT8_STATIC in tries or options.validation is None:
                raise
            # Nothing is calibrated; the export's example input comes from the validation data.
            calibration = validation
    labels = None
    if options.labels is not None:
        labels = load_labels(options.labels, validation.rows)
        notes["labels"] = f"{options.labels} ({validation.rows} labels)"
    notes["validation"] = validation.source
    integers = integer_inputs(model)
    if validation.synthetic and integers:
        notes["warning"] = (
            f"integer inputs ({', '.join(integers)}) hold random values in [0, "
            f"{SYNTHETIC_INT_HIGH}): if they are token ids or categories, these samples are "
            "not what the model meets; give --validation"
        )
    notes["calibration"] = calibration.source if INT8_STATIC in tries else "none (no int8-static)"
    if labels is not None:
        notes["accuracy_basis"] = f"the labels in {options.labels}"
    elif validation.synthetic:
        notes["accuracy_basis"] = (
            "the original model's outputs only, on synthetic inputs (no --validation data)"
        )
    else:
        notes["accuracy_basis"] = "the original model's outputs on the --validation samples"
    return validation, calibration, labels, notes


def run(options: Options, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    model = open_model(options.repository, options.model, options.version)
    check_installed(model)
    tries = options.tries or DEFAULT_TRIES[model.format]
    validation, calibration, labels, notes = _datasets(model, options, tries)
    if options.plot is not None:
        check_plot_available()
    if options.canary is not None:
        check_canary_possible(model)
    server = None
    if options.server is not None:
        server = ServerApi(options.server, model.name)
        server.check(routing=options.canary is not None)
    rules = Rules(
        min_speedup=options.min_speedup,
        max_accuracy_drop=options.max_accuracy_drop,
        min_cosine=Rules.min_cosine if options.min_cosine is None else options.min_cosine,
        min_neighbour_agreement=(
            Rules.min_neighbour_agreement
            if options.min_neighbour_agreement is None
            else options.min_neighbour_agreement
        ),
    )
    evaluation = Evaluation(model, validation, labels, options)
    progress = Progress(1 + len(tries))
    progress.start("original")
    original = evaluation.original(progress)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="inferd-optimize-") as workdir:
        for name in tries:
            progress.start(name)
            outcome = Outcome(name, FAILED)
            outcomes.append(outcome)
            progress("building")
            try:
                outcome.built = build(name, model, Path(workdir), calibration)
            except CandidateError as e:
                outcome.reason = f"cannot be built: {e}"
                progress(outcome.reason)
                continue
            outcome.description = outcome.built.description
            evaluation.candidate(outcome, progress)
            judge(outcome, original, model.preferred_batch, rules, model.format)
        winner = pick_winner(outcomes)
        report = Report(model, rules, original, outcomes, winner, notes)
        code = EXIT_OK if winner is not None else EXIT_NO_WINNER
        if winner is not None and options.publish:
            code = _publish(report, options, server, progress)
    print(table(report), file=out)
    for line in _published_lines(report):
        print(line, file=out)
    if options.json is not None:
        write_json(report, options.json)
    if options.plot is not None:
        write_plot(report, options.plot)
    return code


def _publish(report: Report, options: Options, server: ServerApi | None, progress: Progress) -> int:
    winner = report.winner
    assert winner is not None and winner.built is not None
    model = report.model
    progress.name = f"publish {winner.name}"
    try:
        published = publish(model, winner.built, to_json(report))
        report.published = published.to_json()
        progress(f"wrote {published.directory} ({published.checksum})")
        if server is not None:
            server.wait_until_serving(
                published.version, published.checksum, options.wait_s, progress
            )
            report.published["served"] = True
            if options.canary is not None:
                weights = {
                    str(published.version): options.canary,
                    str(model.version): 100 - options.canary,
                }
                routing = server.set_weights(weights)
                report.published["routing"] = routing
                progress(f"canary weights set: {json.dumps(weights)}")
    except PublishError as e:
        print(f"inferd optimize: {e}", file=sys.stderr)
        report.published["error"] = str(e)
        return EXIT_PUBLISH_FAILED
    return EXIT_OK


def _published_lines(report: Report) -> list[str]:
    done = report.published
    if not done or "version" not in done:
        return []
    lines = [
        f"published: {report.model.name} version {done['version']} in {done['directory']}, "
        f"checksum {done['checksum']}"
    ]
    if done.get("policy_note"):
        lines.append(f"warning: {done['policy_note']}")
    if done.get("served"):
        lines.append(f"served: version {done['version']} is ready with that checksum")
    if "routing" in done:
        lines.append(f"canary: routing weights {json.dumps(done['routing'].get('weights'))}")
    if "error" in done:
        lines.append(f"not completed: {done['error']}")
    return lines
