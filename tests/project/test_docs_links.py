"""The README and docs/ hold together: every relative link points to a file of the repository, and
the README stays short enough to read in five minutes."""

import re
from pathlib import Path

import paths
import pytest

REPO = paths.REPO
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "model_cards").glob("README.md"))]
#: Markdown links and images: [text](target) / ![alt](target), the target up to a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
README_MAX_LINES = 200


def relative_links(page: Path) -> list[str]:
    """The targets of ``page``'s links that are not URLs or in-page anchors, outside code blocks."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = LINK.findall(text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_the_pages_are_found():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "docs/benchmarks.md", "docs/adding_a_method.md", "docs/serving.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_points_to_an_existing_file(page):
    broken = []
    for target in relative_links(page):
        path = target.split("#", 1)[0]
        if not (page.parent / path).resolve().exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links to missing files: {broken}"


def test_readme_is_at_most_200_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES}"


def test_the_link_pattern_sees_links_images_and_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "[a](docs/a.md) ![img](images/p.png) [anchor](b.md#part) [web](https://x.org) [here](#top)\n"
        "```\n[in code](not/a/link.md)\n```\n"
    )
    assert relative_links(page) == ["docs/a.md", "images/p.png", "b.md#part"]
