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


@app.command("chaos")
def chaos_command(
    txns: Annotated[int, typer.Option("--txns", help="orders to move, one transaction each")] = 500,
    seed: Annotated[int, typer.Option("--seed", help="the fault schedule's seed (replays exactly)")] = 1,
    workers: Annotated[int, typer.Option("--workers")] = 3,
    storage: Annotated[str | None, typer.Option("--storage", help="storage URL (default: a new temp dir)")] = None,
    fault_interval_s: Annotated[float, typer.Option("--fault-interval")] = 1.0,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Run the chaos workload under a seeded fault schedule and check it exactly-once."""
    import json
    import tempfile

    import runtime as rt
    from runtime.chaos import run_chaos

    client = rt.connect(storage=storage or f"file://{tempfile.mkdtemp(prefix='raytxn-chaos-')}")
    try:
        result = run_chaos(client, txns=txns, seed=seed, workers=workers, fault_interval_s=fault_interval_s,
                           progress=None if json_out else console.print)
    finally:
        client.close()
        rt.shutdown()
    if json_out:
        print(json.dumps({"seed": seed, "txns": txns, "clean": result.clean, "committed": result.committed,
                          "aborted": result.aborted, "seconds": round(result.seconds, 1),
                          "faults": len(result.schedule), "anomalies": result.report.summary(),
                          "errors": result.errors}))
    else:
        console.print(result.summary())
    if not result.clean:
        raise typer.Exit(1)


@app.command("version")
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as dist_version

    console.print(dist_version("raytxn"))


if __name__ == "__main__":
    app()
