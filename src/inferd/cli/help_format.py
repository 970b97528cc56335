"""`--help` text for every `inferd` command: each option's default said once, and only when
it says something."""

from __future__ import annotations

import argparse


def _says_nothing(default: object) -> bool:
    """None, a flag's False, '' and []: printing them as '(default: )' only adds noise.
    (Not `default in (...)`: 0 == False, and a default of 0 does say something.)"""
    if default is None or default is False or default is argparse.SUPPRESS:
        return True
    return isinstance(default, str | list | tuple) and not default


class DefaultsOnceFormatter(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter, except that an option whose help already
    says its default (often in words: "default: the server's choice") does not get a second
    '(default: ...)', and empty defaults are not printed at all."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or _says_nothing(action.default):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text + " (default: %(default)s)"
        return text
