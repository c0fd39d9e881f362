"""Check that every relative link and #anchor in README.md and docs/ resolves (`make lint` runs it).

A link is ``[text](target)`` or ``![alt](target)`` outside code; a link with a scheme
(``https:``, ``mailto:``) is not followed. A relative target must name a file or folder that
exists (relative to the Markdown file, or to the repository for ``/...``); its ``#anchor``, when
it points into a Markdown file (or the same one), must be a heading of that file as GitHub slugs
it (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for repeats) or an
``<a id=...>`` / ``<a name=...>`` of its own. Problems print as ``file:line: target: what``.

    python -m stack.doc_links [--root DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# What GitHub drops from a heading's text to make its anchor: anything but letters, digits,
# marks, underscores, spaces and hyphens.
_NOT_SLUG = re.compile(r"[^\w\- ]", re.UNICODE)


@dataclass(frozen=True)
class Problem:
    file: str  # relative to the root, with "/"
    line: int
    message: str


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").replace("*", "")
    return _NOT_SLUG.sub("", text.strip().lower()).replace(" ", "-")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code, with inline code spans blanked out."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return out


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown document offers: its headings' slugs and its own <a id>s."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            repeat = seen.get(base, 0)
            seen[base] = repeat + 1
            found.add(base if repeat == 0 else f"{base}-{repeat}")
    return found


def documents(root: Path) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    readme = root / "README.md"
    return ([readme] if readme.is_file() else []) + sorted((root / "docs").rglob("*.md"))


def check(root: Path) -> list[Problem]:
    root = root.resolve()
    cache: dict[Path, set[str]] = {}

    def anchors_of(path: Path) -> set[str]:
        if path not in cache:
            cache[path] = anchors(path.read_text(encoding="utf-8"))
        return cache[path]

    problems = []
    for doc in documents(root):
        name = doc.relative_to(root).as_posix()
        for number, line in _prose_lines(doc.read_text(encoding="utf-8")):
            for target in _LINK.findall(line):
                if _SCHEME.match(target):
                    continue
                path_part, _, anchor = target.partition("#")
                path_part = urllib.parse.unquote(path_part)
                if not path_part:
                    dest = doc
                elif path_part.startswith("/"):
                    dest = root / path_part.lstrip("/")
                else:
                    dest = doc.parent / path_part
                if not dest.exists():
                    problems.append(Problem(name, number, f"{target}: no such file"))
                    continue
                if anchor and dest.is_file() and dest.suffix == ".md" and \
                        urllib.parse.unquote(anchor) not in anchors_of(dest.resolve()):
                    problems.append(Problem(name, number, f"{target}: no such anchor"))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=REPO, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    problems = check(args.root)
    for p in problems:
        print(f"{p.file}:{p.line}: {p.message}")
    if problems:
        print(f"doc links: {len(problems)} broken (README.md and docs/)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
