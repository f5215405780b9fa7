"""Sphinx configuration of replicaft's docs site (``make docs``: warnings are errors)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent / "_ext")]

project = "replicaft"
author = "the replicaft developers"
copyright = "2026, the replicaft developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "benchmark_results",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]

html_theme = "furo"
html_title = "replicaft"

# The API pages document what a script imports. Type hints name torch's and the standard
# library's types, which this site does not document: they are shown, not linked.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
