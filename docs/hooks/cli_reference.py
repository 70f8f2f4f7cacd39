"""mkdocs hook: the CLI reference (docs/reference/cli.md) generated from the typer app.

The page holds a marker line; this hook replaces it with typer's own markdown for every command
(``typer.cli.get_docs_for_click``, what ``typer raytxn.tools.cli utils docs`` prints), so the
reference is the app's help texts and options and cannot drift from them. Headings move one level
down, under the page's title. Usage lines go in ``text`` fences: they are syntax, not commands
to run (tests/integration/test_docs.py runs the shell blocks of the pages' own sources).
"""

from __future__ import annotations

import re
from typing import Any

MARKER = "<!-- cli-reference -->"


def cli_markdown() -> str:
    import typer
    import typer.cli

    from raytxn.tools.cli import app

    command = typer.main.get_command(app)
    ctx = typer.models.Context(command, info_name="raytxn")
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="raytxn", title="raytxn")
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)
    return text.replace("```console\n$ ", "```text\n")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_markdown())
