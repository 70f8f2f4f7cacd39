"""Benchmarks: `python examples/benchmark.py ledger [--short] [--out FILE]` (same as `raytxn bench`)."""

from raytxn.tools.cli import app

if __name__ == "__main__":
    app(["bench", *__import__("sys").argv[1:]])
