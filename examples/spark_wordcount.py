"""Exactly-once word count with Spark on Ray (RayDP), printed as a table.

Lines go onto a raytxn topic; an ExactlyOncePipeline reads micro-batches, counts words with Spark,
writes (word, count) from the Spark tasks inside one transaction per batch and acknowledges the
batch's input in the same transaction. The totals equal a plain-Python count of the same lines.
Run: .venv/bin/python examples/spark_wordcount.py
"""

from __future__ import annotations

import uuid

from rich.console import Console
from rich.table import Table

import raytxn as rt
from raytxn.connectors import spark as sc
from raytxn.connectors.wordcount import expected_counts, sample_lines, total_counts, wordcount


def main() -> None:
    console = Console()
    client = rt.connect()
    run = uuid.uuid4().hex[:6]
    source, sink = f"lines-{run}", f"word-counts-{run}"
    client.create_topic(source, 2)
    client.create_topic(sink, 2)
    lines = sample_lines(500)
    producer = client.create_producer(source)
    for i, line in enumerate(lines):
        producer.send_async(line.encode(), key=str(i))
    producer.flush()
    spark = sc.init_spark("raytxn-wordcount")
    pipeline = sc.ExactlyOncePipeline(spark, client, source, "wordcount", sink, wordcount, f"wordcount-{run}",
                                      batch_max_messages=100)
    for s in pipeline.run(until_idle=True):
        console.print(f"batch {s.batch}: {s.rows_in} lines in, {s.rows_out} counts out, "
                      f"{s.batch_s:.2f}s (commit {s.commit_s * 1000:.0f} ms) {s.txn}")
    totals = total_counts(client, sink, "print")
    table = Table(title=f"word counts ({sink})")
    table.add_column("word")
    table.add_column("count", justify="right")
    for word, count in sorted(totals.items()):
        table.add_row(word, str(count))
    console.print(table)
    console.print(f"equal to the plain-Python count: {totals == expected_counts(lines)}")
    sc.stop_spark()
    client.close()
    rt.shutdown()


if __name__ == "__main__":
    main()
