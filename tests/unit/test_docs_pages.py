"""The README and the docs pages keep their conventions (tests/docs_blocks.py), without Ray: every
fence names its language, a command left unrun says why, the README stays short with its two
set-up commands, and nothing in the project points outside the repository."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.docs_blocks import (
    DOCS,
    OTHER_LANGUAGES,
    README,
    ROOT,
    RUN_LANGUAGES,
    blocks,
    page_name,
    pages,
)


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_every_fence_names_a_known_language(page) -> None:
    for block in blocks(page):
        assert block.language in RUN_LANGUAGES | OTHER_LANGUAGES, f"{block.where}: fence language {block.language!r}"
        if block.not_run_reason is not None:
            assert block.language == "bash", f"{block.where}: only commands may be marked not run"
            assert len(block.not_run_reason) > 10, f"{block.where}: say why it is not run"


def test_fences_are_found() -> None:
    """The parser finds indented fences too (in lists) and keeps the markers."""
    sample = DOCS / "guides" / "cli.md"
    assert any(b.language == "bash" and b.not_run_reason for b in blocks(sample))


def test_readme_is_short_and_keeps_exactly_two_setup_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 250
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^make \w+", setup, flags=re.M) == ["make demo", "make test"]


def test_readme_links_into_the_docs_resolve() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text())
    assert len(links) >= 8
    for link in links:
        assert (ROOT / link).is_file(), link


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [name for name in out.splitlines() if (ROOT / name).is_file()]


def test_nothing_points_outside_the_repository() -> None:
    outside = re.compile(r"shared/DESIGN|\.\./shared|DESIGN §|DESIGN\.md")
    hits = [f"{name}:{n}" for name in tracked_files() if not name.endswith((".png", ".whl"))
            for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
            if outside.search(line) and name != "tests/unit/test_docs_pages.py"]
    assert hits == []


def test_design_section_references_name_sections_that_exist() -> None:
    design = (DOCS / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+[a-z]?)\.", design, flags=re.M))
    refs = {(name, ref) for name in tracked_files() if name.endswith((".py", ".md", ".toml"))
            for ref in re.findall(r"docs/design\.md §(\d+[a-z]?)", (ROOT / name).read_text(errors="replace"))}
    assert refs, "the code refers to the design's sections"
    assert {(name, ref) for name, ref in refs if ref not in sections} == set()
