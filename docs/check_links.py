"""Check every link of the built site: each relative link names a page that was built and, with
``#anchor``, an element of that page with that id. ``python docs/check_links.py docs/_build/html``

Sphinx's own ``linkcheck`` builder fetches external links; this machine and CI reach no other
host, so external links are listed, not fetched (they are few: torchft's and the papers').
What can break with a refactor, a page or a heading renamed, is internal, and that is checked.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "a" and values.get("href"):
            self.links.append(values["href"] or "")


def check(site: Path) -> tuple[list[str], set[str]]:
    """Broken internal links (``page: link``) and the external links seen."""
    pages: dict[Path, _Page] = {}
    for path in site.rglob("*.html"):
        parser = _Page()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = parser
    broken: list[str] = []
    external: set[str] = set()
    for path, page in pages.items():
        for link in page.links:
            scheme = urlparse(link).scheme
            if scheme in ("http", "https", "mailto"):
                external.add(link)
                continue
            target, anchor = urldefrag(link)
            target_path = (path.parent / unquote(target)).resolve() if target else path
            if target_path.is_dir():
                target_path = target_path / "index.html"
            if target_path.suffix != ".html":
                if not target_path.exists():
                    broken.append(f"{path.relative_to(site.resolve())}: {link} (no such file)")
                continue
            if target_path not in pages:
                broken.append(f"{path.relative_to(site.resolve())}: {link} (no such page)")
            elif anchor and unquote(anchor) not in pages[target_path].ids:
                broken.append(f"{path.relative_to(site.resolve())}: {link} (no such anchor)")
    return broken, external


def main(argv: list[str]) -> int:
    site = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    if not (site / "index.html").exists():
        print(f"{site}: no built site here (run `make docs`)", file=sys.stderr)
        return 2
    broken, external = check(site)
    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    print(f"links: {len(broken)} broken internal; {len(external)} external, listed, not fetched (offline)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
