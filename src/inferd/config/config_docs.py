"""The tables of docs/model-config.md, written from `fields` and `parameters`.

    python -m inferd.config.config_docs docs/model-config.md   # rewrite the tables

Each table sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers in the page; a
test fails when the page and the code disagree, so the page stays true.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.config_field_rules import Status
from inferd.config.config_fields import FIELDS
from inferd.config.config_parameters import (
    BACKEND_PARAMETERS,
    INFERD_PARAMETERS,
    PASS_THROUGH_BACKENDS,
)


def field_paths(descriptor: Any = None, prefix: str = "") -> Iterator[str]:
    """Every field path of `ModelConfig`, in declaration order, through nested messages
    (a map's values, a repeated field's elements)."""
    descriptor = descriptor or mc.ModelConfig.DESCRIPTOR
    for field in descriptor.fields:
        path = prefix + field.name
        yield path
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            message = message.fields_by_name["value"].message_type
        if message is not None and message is not descriptor:
            yield from field_paths(message, path + ".")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def fields_table() -> str:
    rows = ["| field | status | what inferd does, or why not |", "|---|---|---|"]
    for path in field_paths():
        rule = FIELDS.get(path)
        if rule is None:
            rows.append(f"| `{path}` | **unclassified** | |")
            continue
        status = rule.status.value
        if rule.status is Status.HONOURED and rule.backends:
            status += f" ({', '.join(rule.backends)} only)"
        note = _cell(rule.note)
        refused_above = _refused_ancestor(path)
        if rule.status is Status.REFUSED and refused_above:
            # Unreachable while the ancestor is refused; say so rather than repeat its reason.
            same = FIELDS[refused_above].note == rule.note
            note = f"as `{refused_above}`" if same else f"{note} (and `{refused_above}` is refused)"
        rows.append(f"| `{path}` | {status} | {note} |")
    return "\n".join(rows)


def _refused_ancestor(path: str) -> str:
    """The outermost refused field holding `path`, or ""."""
    parts = path.split(".")
    for end in range(1, len(parts)):
        above = ".".join(parts[:end])
        rule = FIELDS.get(above)
        if rule is not None and rule.status is Status.REFUSED:
            return above
    return ""


def parameters_table() -> str:
    rows = ["| key | read by | what it does |", "|---|---|---|"]
    rows += [
        f"| `{k}` | inferd, every backend | {_cell(v)} |" for k, v in INFERD_PARAMETERS.items()
    ]
    for backend, keys in BACKEND_PARAMETERS.items():
        rows += [f"| `{k}` | {backend} | {_cell(v)} |" for k, v in keys.items()]
    rows.append(
        f"| any other key | {', '.join(PASS_THROUGH_BACKENDS)}: passed to the model; "
        "other backends: refused | the load fails naming the key and the accepted ones |"
    )
    return "\n".join(rows)


TABLES = {"config-fields": fields_table, "config-parameters": parameters_table}


def rewrite(page: str) -> str:
    """`page` with every table between its markers replaced by the current one."""
    for name, render in TABLES.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        head, found, rest = page.partition(begin)
        if not found or end not in rest:
            raise ValueError(f"the page has no {begin} ... {end} markers")
        _, _, tail = rest.partition(end)
        page = f"{head}{begin}\n{render()}\n{end}{tail}"
    return page


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/model-config.md")
    target.write_text(rewrite(target.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"rewrote the tables of {target}")
