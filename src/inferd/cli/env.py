"""Twelve-factor configuration: every `inferd serve` option also read from `INFERD_*`.

`--http-port` is `INFERD_HTTP_PORT`, `--exit-timeout-secs` is `INFERD_EXIT_TIMEOUT_SECS`:
the option's long name, upper-cased, dashes as underscores, after `INFERD_`. The mapping is
derived from the parser, so an option added later gets its variable with no change here
(tests/unit/cli/test_cli_env.py walks the parser to keep it so). A flag on the command line wins
over its variable; a variable wins over the built-in default. A value a variable holds goes
through the option's own type and choices, and a bad one is an error naming the variable.

Values: as on the command line; a flag (`--metrics-triton-names`) takes true/false (1/0,
yes/no, on/off); a repeatable option (`--load-model`) takes several values separated by
spaces, quoted as in a shell where one holds a space.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "INFERD_"
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class EnvironmentParser(argparse.ArgumentParser):
    """An ArgumentParser whose options fall back on their `INFERD_*` variables.

    Used for `inferd serve`: the top-level parser hands it the subcommand's arguments, so the
    variables apply however the command line is parsed (main, or tests calling parse_args).
    """

    environ: Mapping[str, str] = os.environ

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        variables = {a: variable_name(a) for a in options(self)}
        present = {a: n for a, n in variables.items() if n in self.environ}
        if not present:
            return parsed, extras
        given = self._given(args)
        for action, name in present.items():
            if action.dest in given:
                continue  # the command line says what is meant
            try:
                value = from_text(action, self.environ[name])
            except ValueError as exc:
                self.error(f"{name}={self.environ[name]!r}: {exc}")
            setattr(parsed, action.dest, value)
        return parsed, extras

    def _given(self, args: Sequence[str] | None) -> set[str]:
        """The dests the command line sets: parsed again with every default None, what is
        still None was not given (no option's type turns a text into None)."""
        saved = [(a, a.default) for a in self._actions]
        try:
            for action in self._actions:
                action.default = None
            again, _ = super().parse_known_args(args, None)
        finally:
            for action, default in saved:
                action.default = default
        return {dest for dest, value in vars(again).items() if value is not None}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options that have a variable: all but --help (and --version)."""
    return [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
    ]


def variable_name(action: argparse.Action) -> str:
    """`--exit-timeout-secs` -> `INFERD_EXIT_TIMEOUT_SECS`."""
    long = next((s for s in action.option_strings if s.startswith("--")), None)
    if long is None:
        raise TypeError(f"option {action.option_strings} has no long name to derive a variable")
    return PREFIX + long[2:].upper().replace("-", "_")


def from_text(action: argparse.Action, text: str) -> Any:
    """The value `text` stands for, as the option would parse it (ValueError when bad).

    TypeError for a kind of option this module does not know: the parser test fails on it,
    before anyone can set a variable nobody reads.
    """
    if isinstance(action, argparse.BooleanOptionalAction):
        return _boolean(text)
    if isinstance(action, argparse._StoreConstAction):  # store_true / store_false / const
        return action.const if _boolean(text) else action.default
    if isinstance(action, argparse._AppendAction):
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise ValueError(f"cannot split it into values: {exc}") from None
        return [_one(action, word) for word in words]
    if isinstance(action, argparse._StoreAction):
        if action.nargs == "?" and text == "":
            return action.const  # as the bare flag
        if action.nargs not in (None, "?"):
            raise TypeError(f"{action.option_strings[0]}: nargs={action.nargs!r} has no mapping")
        return _one(action, text)
    raise TypeError(f"{action.option_strings[0]}: {type(action).__name__} has no mapping")


def _boolean(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("expected true or false (1/0, yes/no, on/off)")


def _one(action: argparse.Action, text: str) -> Any:
    convert = action.type
    if convert is None:
        value: Any = text
    elif callable(convert):
        try:
            value = convert(text)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            kind = getattr(convert, "__name__", "value")
            detail = (
                str(exc) if isinstance(exc, argparse.ArgumentTypeError) else f"not a valid {kind}"
            )
            raise ValueError(f"{detail} (as {action.option_strings[0]} takes)") from None
    else:
        raise TypeError(f"{action.option_strings[0]}: type {convert!r} is not callable")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"expected one of {choices} (as {action.option_strings[0]} takes)")
    return value


def unknown_variables(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> list[str]:
    """`INFERD_*` variables that name no option of `parser` (typos, most likely)."""
    known = {variable_name(a) for a in options(parser)}
    return sorted(n for n in environ if n.startswith(PREFIX) and n not in known)
