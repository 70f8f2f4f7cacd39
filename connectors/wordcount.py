"""The word counts used by the examples and tests: lines in, (word, count) per batch out, or running
totals kept as state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


def wordcount(df: Any) -> Any:
    """DataFrame of messages -> DataFrame(key=word, value=count in this batch)."""
    from pyspark.sql import functions as F

    words = df.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
    counts = words.groupBy("word").count()
    return counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))


def running_wordcount_spark(df: Any, state: Any) -> tuple[Any, Any]:
    """The stateful word count of ``ExactlyOncePipeline(state_topic=...)``: each batch emits, and
    stores as state, the new running total of every word it holds (its count in the batch plus
    the total the state held)."""
    from pyspark.sql import functions as F

    batch = wordcount(df)
    totals = batch.join(state.withColumnRenamed("value", "total"), "key", "left").select(
        "key", (F.col("value").cast("long") + F.coalesce(F.col("total").cast("string").cast("long"), F.lit(0)))
        .cast("string").alias("value"))
    return totals, totals


def running_wordcount_ray(ds: Any, state: Any) -> tuple[Any, Any]:
    """The stateful word count of ``raytxn.connectors.ray_data.StatefulDataPipeline``, all in Ray
    tasks: the batch's words (count 1 each) and the state's totals (count 0) are grouped by word;
    each word of the batch gets its new running total, emitted and stored as state."""
    words = ds.flat_map(lambda row: [{"key": w, "n": 1, "total": 0} for w in bytes(row["value"]).decode().split(" ")])
    known = state.map(lambda row: {"key": row["key"], "n": 0, "total": int(row["value"])})

    def fold(group: Any) -> Any:  # one word's rows, as a pandas DataFrame
        import pandas as pd

        n = int(group["n"].sum())
        if n == 0:  # a word of the state only: unchanged
            return pd.DataFrame({"key": pd.Series([], dtype=object), "value": pd.Series([], dtype=object)})
        total = int(group["total"].sum()) + n
        return pd.DataFrame({"key": [group["key"].iloc[0]], "value": [str(total).encode()]})

    # Two shuffle partitions, not Ray Data's default 200: a micro-batch's words are few.
    totals = words.union(known).groupby("key", num_partitions=2).map_groups(fold, batch_format="pandas").materialize()
    return totals, totals


def running_wordcount(rows: list[dict[str, Any]], state: Mapping[str, bytes]) -> tuple[list, dict]:
    """The stateful word count of ``raytxn.connectors.stateful.StatefulPipeline``: each batch
    emits, and stores as state, the new running total of every word it holds."""
    counts = Counter(word for row in rows for word in row["value"].decode().split(" "))
    totals = {word: str(int(state.get(word, b"0")) + n).encode() for word, n in counts.items()}
    return list(totals.items()), totals


def expected_counts(lines: Iterable[str]) -> Counter:
    """The same count computed in plain Python, independently of Spark and raytxn."""
    return Counter(word for line in lines for word in line.split(" "))


def total_counts(client: Any, topic: str, subscription: str, idle_s: float = 3.0) -> Counter:
    """Sum every (word, count) output of all committed batches, read from the start."""
    import raytxn as rt

    consumer = client.subscribe(topic, subscription, initial_position=rt.InitialPosition.Earliest)
    totals: Counter = Counter()
    try:
        while True:
            try:
                message = consumer.receive(timeout=idle_s)
            except rt.errors.Timeout:
                return totals
            totals[message.key()] += int(message.value())
    finally:
        consumer.close()


def sample_lines(n: int) -> list[str]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(1 + i % 6)) for i in range(n)]
