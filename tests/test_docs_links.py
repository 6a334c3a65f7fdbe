"""Every relative link of README.md and docs/*.md reaches a file, and its #anchor a heading.

The README is the user's page and docs/ the operators' reference, one page per
subject, linked to each other. A page renamed, a heading reworded or a section
moved breaks those links silently on GitHub; this test follows each one. An
anchor is matched as GitHub makes them from a page's headings: the heading's
text, lowercased, its punctuation dropped and its spaces turned into dashes,
with ``-1``, ``-2``... after a repeated one. Links inside code (fenced blocks
and `spans`) are not links, and links to other sites are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
_REFERENCE = re.compile(r"^[ \t]{0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t]+.*)?$", re.MULTILINE)
_HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)=[\"']([^\"']+)[\"']", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def without_blocks(text: str) -> str:
    """The text with its fenced code blocks blanked (their newlines kept)."""
    return _FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)


def without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked."""
    return _SPAN.sub(lambda match: " " * len(match.group(0)), without_blocks(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(char for char in text if char.isalnum() or char in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (repeats numbered) and HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(without_blocks(text)):  # a heading's code spans count
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(_HTML_ANCHOR.findall(text))
    return found


def links(text: str) -> list[str]:
    prose = without_code(text)
    return _INLINE.findall(prose) + _REFERENCE.findall(prose)


def problems(files: list[Path], root: Path) -> list[str]:
    """Why each relative link of ``files`` does not resolve; [] when every one does."""
    found = []
    for page in files:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(root)
        for target in links(text):
            if _SCHEME.match(target) or target.startswith("//"):
                continue  # another site (https:, mailto:): not followed
            path_part, _, anchor = target.partition("#")
            path_part, anchor = unquote(path_part), unquote(anchor)
            linked = (page.parent / path_part).resolve() if path_part else page
            if path_part.startswith("/"):
                found.append(f"{where}: {target}: an absolute path; link relative to the page")
                continue
            if root not in linked.parents and linked != root:
                found.append(f"{where}: {target}: outside the repository")
                continue
            if not linked.exists():
                found.append(f"{where}: {target}: no such file ({linked.relative_to(root)})")
                continue
            if anchor:
                if linked.suffix.lower() != ".md" or linked.is_dir():
                    found.append(f"{where}: {target}: an anchor into a file that has no headings")
                elif anchor not in anchors(linked.read_text(encoding="utf-8")):
                    found.append(f"{where}: {target}: {linked.relative_to(root)} has no heading "
                                 f"whose anchor is #{anchor}")
    return found


def test_every_relative_link_resolves_to_a_file_and_a_heading():
    found = problems(pages(), ROOT)
    assert not found, "broken links in the README and docs/:\n" + "\n".join(found)


def test_the_readme_and_docs_link_to_each_other():
    readme_links = links((ROOT / "README.md").read_text(encoding="utf-8"))
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in {link.partition("#")[0] for link in readme_links}, (
            f"README.md does not link to docs/{page.name}")


def test_slugs_follow_githubs_rules():
    assert slug("Quick start") == "quick-start"
    assert slug("`[[model]]`: one model and how it is loaded") == "model-one-model-and-how-it-is-loaded"
    assert slug("2026-12-06 (later): the runtimes of 0.7.0 and 0.6.3") == (
        "2026-12-06-later-the-runtimes-of-070-and-063")
    assert slug("What's `new_thing`, [here](x.md)?") == "whats-new_thing-here"
    assert anchors("# A\n\n## A\n\n```\n# not a heading\n```\n## B\n") == {"a", "a-1", "b"}


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Set up\n\nText.\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "# Project\n\n"
        "[fine](docs/guide.md), [fine too](docs/guide.md#set-up), [here](#project),\n"
        "[gone](docs/missing.md), [bad anchor](docs/guide.md#setup), [self](#nowhere),\n"
        "`[code](docs/not-a-link.md)` and [a site](https://example.org/x.md#y).\n\n"
        "```\n[in a block](docs/not-a-link-either.md)\n```\n",
        encoding="utf-8",
    )
    found = problems([tmp_path / "README.md", tmp_path / "docs" / "guide.md"], tmp_path)
    assert len(found) == 3, found
    assert "docs/missing.md: no such file" in found[0]
    assert "has no heading whose anchor is #setup" in found[1]
    assert "#nowhere" in found[2]
