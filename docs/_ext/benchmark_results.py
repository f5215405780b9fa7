"""The figures page (``benchmarks.md``): built from ``benchmarks/results/*.json`` at each build.

The page's source holds a marker line; this extension replaces it with a section per
benchmark (what it measures, from its module's docstring; when and where it ran; every figure
beside its baseline; its notes), so the published figures are always the recorded ones and a
benchmark run never edits a page.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx

from benchmarks.registry import BENCHMARKS, describe
from benchmarks.results import RESULTS_DIR, read_records, results_page

MARKER = "<!-- benchmark-results -->"


def _expand(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname != "benchmarks" or MARKER not in source[0]:
        return
    records = read_records(RESULTS_DIR)
    for path in sorted(RESULTS_DIR.glob("*.json")):
        app.env.note_dependency(str(path))  # a new result rebuilds the page
    descriptions = {r["name"]: describe(r["name"]) for r in records if r["name"] in BENCHMARKS}
    source[0] = source[0].replace(MARKER, "\n".join(results_page(records, descriptions)))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _expand)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
