"""The tools as subcommands of `inferd`: the server's command line registers their parsers
here and hands their parsed arguments back. Building the parsers imports little (every
`inferd` command builds them all); a tool's engine is imported only when it runs."""

from __future__ import annotations

import argparse

from inferd_tools.bench.options import add_bench_parser
from inferd_tools.optimize.main import add_optimize_parser
from inferd_tools.tune.main import add_tune_parser

NAMES = frozenset({"bench", "tune", "optimize"})


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_bench_parser(commands)
    add_tune_parser(commands)
    add_optimize_parser(commands)


def run(args: argparse.Namespace) -> int:
    """Run the tool `args.command` names (one of NAMES); its exit status."""
    if args.command == "bench":
        from inferd_tools.bench.main import main as bench_main

        return bench_main(args)
    if args.command == "optimize":
        from inferd_tools.optimize.main import main as optimize_main

        return optimize_main(args)
    if args.command == "tune":
        from inferd_tools.tune.main import main as tune_main

        return tune_main(args)
    raise ValueError(f"no tool named {args.command!r}")
