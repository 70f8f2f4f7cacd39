"""Every ```python block of the README runs (the README's snippets are part of the contract)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {"__name__": "readme"})


def test_readme_keeps_exactly_two_setup_commands() -> None:
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make \w+", setup, flags=re.M)
    assert commands == ["make demo", "make test"]
