"""The docs site's own checks: its link checker finds what it must, and the README stays a page."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("check_links", REPO_ROOT / "docs" / "check_links.py")
assert spec is not None and spec.loader is not None
check_links = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_links)


def write(site: Path, name: str, body: str) -> None:
    path = site / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<html><body>{body}</body></html>")


def test_links_to_missing_pages_and_anchors_are_broken_and_external_ones_listed(tmp_path: Path) -> None:
    write(
        tmp_path,
        "index.html",
        '<a href="guide/a.html#there">ok</a> <a href="guide/a.html#gone">x</a>'
        ' <a href="nowhere.html">x</a> <a href="https://example.org/">ext</a> <a href="#top">self</a>'
        ' <p id="top"></p> <a href="_static/missing.css">x</a>',
    )
    write(tmp_path, "guide/a.html", '<h2 id="there">There</h2> <a href="../index.html">up</a>')
    broken, external = check_links.check(tmp_path)
    assert sorted(broken) == [
        "index.html: _static/missing.css (no such file)",
        "index.html: guide/a.html#gone (no such anchor)",
        "index.html: nowhere.html (no such page)",
    ]
    assert external == {"https://example.org/"}


def test_the_readme_fits_on_a_page_or_two() -> None:
    lines = (REPO_ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; the manual belongs in docs/"


def test_no_benchmark_writes_the_readme() -> None:
    # The figures page is built from benchmarks/results/*.json (docs/_ext/benchmark_results.py).
    offenders = [p.name for p in (REPO_ROOT / "benchmarks").rglob("*.py") if "README.md" in p.read_text()]
    assert not offenders, offenders
