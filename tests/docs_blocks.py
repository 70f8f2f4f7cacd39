"""The code blocks of the README and of every docs/ page, as the tests run them.

Conventions of the pages (checked by tests/unit/test_docs_pages.py, run by
tests/integration/test_docs.py and, for Spark pages, tests/spark/test_pipeline.py):

- Every fence names its language.
- ``python`` blocks always run. The python blocks of one page are one program, in page order, run
  in a process of its own (a page reads as one session: it connects once and ends with
  ``rt.shutdown()``). The program is laid out so that its line numbers are the page's, so a
  traceback names the page's line.
- ``bash`` blocks are commands. They run, a page's blocks in order, in a fresh directory, unless
  the line right before the fence says why not: ``<!-- not run: REASON -->`` (an HTML comment,
  not shown on the site), e.g. a command that starts a Ray of its own or runs the whole suite.
- ``text`` blocks are output, syntax or illustrations, never run; ``json``/``toml``/``yaml``
  blocks are data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
RUN_LANGUAGES = {"python", "bash"}
OTHER_LANGUAGES = {"text", "json", "toml", "yaml"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    language: str
    code: str
    line: int  # the page's line number of the block's first code line (1-based)
    not_run_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the site (the hooks' folder holds code, not pages)."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        indent = match["indent"]
        fence_line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.search(before)
        body = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match["body"].splitlines(keepends=True))
        found.append(Block(page, match["info"].strip().split(" ")[0], body, fence_line + 1,
                           marker["reason"] if marker else None))
    return found


def python_program(page: Path) -> str:
    """The page's python blocks as one program whose line N is the page's line N."""
    program = ""
    for block in blocks(page):
        if block.language == "python":
            program += "\n" * (block.line - 1 - program.count("\n")) + block.code
    return program


def shell_blocks(page: Path) -> list[Block]:
    """The page's bash blocks to run (those not marked ``not run``), in page order."""
    return [b for b in blocks(page) if b.language == "bash" and b.not_run_reason is None]


def uses_spark(page: Path) -> bool:
    """Spark pages run in tests/spark/test_pipeline.py, first in that module: RayDP keeps one Spark
    per Ray namespace, and a Spark start beside another's took 124 s instead of about 45."""
    return "init_spark" in python_program(page)


def program_seconds(page: Path) -> int:
    """A page's time alone, for the test order (tests/conftest.py): an engine start each connect,
    a Spark start, Ray Data's tasks, a SeaweedFS start, a Kafka consumer group's first rebalance,
    Ray Serve's start."""
    program = python_program(page)
    return (8 * max(1, program.count("rt.connect(")) + 45 * ("init_spark" in program)
            + 25 * ("connectors.ray_data" in program) + 10 * ("start_seaweedfs" in program)
            + 10 * ("start_gateway" in program) + 20 * ("serve.run(" in program))


PYTHON_PAGES = [p for p in pages() if python_program(p).strip()]
SHELL_PAGES = [p for p in pages() if shell_blocks(p)]
