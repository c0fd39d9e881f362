"""The documentation link checker (stack/doc_links.py): every relative link and #anchor in
README.md and docs/ resolves, and a broken one is named with its file and line."""

from __future__ import annotations

from pathlib import Path

from stack import doc_links

REPO = Path(__file__).parents[3]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _problems(root: Path) -> list[str]:
    return [f"{p.file}:{p.line}: {p.message}" for p in doc_links.check(root)]


def test_the_repository_docs_have_no_broken_link() -> None:
    assert _problems(REPO) == []


def test_links_that_resolve_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "README.md": "# Title\n\n## The five-minute tour\n\n"
                     "See [operating](docs/operating.md#faults-beyond-one-node),\n"
                     "[the tour](#the-five-minute-tour), [code](core/x.py), [a folder](core/),\n"
                     "![img](docs/images/a.png) and [the web](https://example.com/#anything).\n",
        "docs/operating.md": "# Operating\n\n## Faults beyond one node\n\nBack to [the README](../README.md#title),\n"
                             "[emitting `events`](producers.md#emitting-events-the-outbox-outbox).\n",
        "docs/producers.md": "# Producers\n\n## Emitting events: the outbox (`outbox/`)\n",
        "docs/images/a.png": "",
        "core/x.py": "",
    })
    assert _problems(root) == []


def test_a_broken_file_link_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"README.md": "# T\n\nline two\nsee [ops](docs/operatin.md) here\n",
                            "docs/operating.md": "# Operating\n"})
    assert _problems(root) == ["README.md:4: docs/operatin.md: no such file"]


def test_a_broken_anchor_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"README.md": "# T\n\n[ops](docs/operating.md#faults-beyond-two-nodes)\n",
                            "docs/operating.md": "# Operating\n\n## Faults beyond one node\n"})
    assert _problems(root) == ["README.md:3: docs/operating.md#faults-beyond-two-nodes: no such anchor"]


def test_a_broken_anchor_in_the_same_file_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"docs/design.md": "# Design\n\n## Durability\n\nsee [above](#durabilty)\n"})
    assert _problems(root) == ["docs/design.md:5: #durabilty: no such anchor"]


def test_anchors_follow_the_github_slug_rules(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"docs/p.md": "# P\n\n## 1. Current figures\n\n## Notes\n\n### Notes\n\n"
                                         "## What was tried, and why it was kept or dropped\n\n"
                                         "[a](#1-current-figures) [b](#notes-1) "
                                         "[c](#what-was-tried-and-why-it-was-kept-or-dropped) [d](#notes-2)\n"})
    assert _problems(root) == ["docs/p.md:11: #notes-2: no such anchor"]


def test_links_in_code_are_not_links(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"README.md": "# T\n\n```\n[x](missing.md)\n```\n\nand `[y](missing.md)` inline\n"})
    assert _problems(root) == []


def test_main_fails_on_a_broken_link(tmp_path: Path, capsys) -> None:
    root = _tree(tmp_path, {"README.md": "# T\n\n[gone](docs/gone.md)\n"})
    assert doc_links.main(["--root", str(root)]) == 1
    assert "README.md:3: docs/gone.md: no such file" in capsys.readouterr().out
    (root / "docs").mkdir()
    (root / "docs" / "gone.md").write_text("# Gone\n")
    assert doc_links.main(["--root", str(root)]) == 0


def test_the_readme_stays_a_page_for_users_with_its_tour() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    tour = readme.split("\n## The five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    assert tour.split("```\n")[1].startswith("make run LOCAL_RECEIVERS=1")
