"""The ``raytxn`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from runtime import bench

app = typer.Typer(help="raytxn: exactly-once transactional messaging on Ray.", no_args_is_help=True)
console = Console(width=160)


@app.command("bench")
def bench_command(
    names: Annotated[list[str] | None, typer.Argument(help=f"benchmarks: {', '.join(bench.BENCHMARKS)}")] = None,
    short: Annotated[bool, typer.Option("--short", help="small sizes, for a CI smoke run")] = False,
    out: Annotated[Path, typer.Option("--out", help="JSON file to write")] = Path("bench-results/bench.json"),
) -> None:
    """Run benchmarks, print a table, write JSON."""
    names = names or list(bench.BENCHMARKS)
    unknown = [n for n in names if n not in bench.BENCHMARKS]
    if unknown:
        console.print(f"[red]unknown benchmark(s): {', '.join(unknown)}[/red]")
        raise typer.Exit(2)
    rows: list[dict] = []
    for name in names:
        console.print(f"[bold]{name}[/bold]")
        rows += bench.BENCHMARKS[name](short=short, progress=console.print)
    bench.write_results(rows, out)
    table = Table(title="raytxn benchmarks")
    columns = sorted({k for row in rows for k in row}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    console.print(table)
    console.print(f"wrote {out}")


@app.command("version")
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as dist_version

    console.print(dist_version("raytxn"))


if __name__ == "__main__":
    app()
