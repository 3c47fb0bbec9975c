"""The one writer of results files: every benchmark writes ``results/<name>.json`` (its whole document) and
``results/<name>.md`` (its report) here, and renders the parts reports share (the machine line, the table of
result rows and their targets) with these functions."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .core import RESULTS, fmt


def write_results(name: str, doc: dict[str, Any], report: Iterable[str], folder: Path = RESULTS) -> Path:
    """Write ``doc`` as ``<name>.json`` and the ``report`` lines as ``<name>.md`` in ``folder``, say so on
    standard output, and return the report's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    path = folder / f"{name}.md"
    path.write_text("\n".join(report))
    print(f"wrote {folder / f'{name}.json'} and {path}")
    return path


def machine_line(m: dict[str, Any], *extra: str) -> str:
    """``Machine: ...`` from ``machine_info()``'s fields, ``extra`` (such as library versions) before the commit."""
    return (f"Machine: {m['cpu_model']}, {m['cores']} cores ({m['cores_usable']} usable), {m['ram_gb']} GB RAM, "
            f"{m['kernel']}, {m['python']}, {''.join(f'{e}, ' for e in extra)}commit {m['commit'] or '?'}"
            f"{' + uncommitted changes in src' if m['src_modified_since_commit'] else ''}  ")


def status_lines(doc: dict[str, Any]) -> list[str]:
    """Whether the run completed (or where it stopped) and how long it took."""
    return [f"Status: {'complete' if doc['complete'] else 'INCOMPLETE: ' + str(doc.get('error'))}  ",
            f"Duration: {doc['duration_s']:.0f} s"]


def results_table(results: list[dict[str, Any]], value_header: str = "value") -> list[str]:
    """The table of result rows (``Entry.as_json()``): value, baseline, ratio, target and verdict."""
    lines = [f"| metric | unit | {value_header} | baseline | baseline value | ratio | target | result | note |",
             "| --- | --- | ---: | --- | ---: | ---: | --- | --- | --- |"]
    lines += [f"| {e['name']} | {e['unit']} | {fmt(e['value'])} | {e['baseline'] or ''} | "
              f"{fmt(e['baseline_value'])} | {fmt(e['ratio'])} | {e['target'] or ''} | "
              f"{fmt(e['pass']) if e['target'] else ''} | {e['note'].replace('|', '/')} |" for e in results]
    return lines


def target_lines(results: list[dict[str, Any]]) -> list[str]:
    """One PASS/MISS line per result row that has a target."""
    return [f"- {'PASS' if e['pass'] else 'MISS'}: {e['name']} = {fmt(e['value'])} {e['unit']} "
            f"(target {e['target']})" for e in results if e["target"]]


def details_block(details: Any) -> list[str]:
    """The raw statistics as a JSON block closing a report."""
    return ["```json", json.dumps(details, indent=2), "```", ""]
