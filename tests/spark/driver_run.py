"""A pipeline driver process for the driver-crash tests: attaches to the test's Ray and engine,
starts its own Spark on Ray, and runs the word-count pipeline until its input is drained.
Prints `COMMITTING <batch>` before each commit and waits `--pause` seconds there, so the test
can stop or kill it mid-batch. Exit code 3: fenced by a newer incarnation."""

from __future__ import annotations

import argparse
import os
import sys
import time

import ray

import raytxn as rt
from raytxn.connectors import spark as sc
from raytxn.connectors.wordcount import wordcount
from raytxn.errors import Fenced


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()
    # RayDP names its app master RAY_APP_MASTER per namespace: one Spark driver per namespace.
    # Engine actors are always looked up in the "raytxn" namespace, so any namespace works here.
    # log_to_driver=False: workers' log lines must not interleave with the protocol lines below
    ray.init(address=args.address, namespace=f"driver-{os.getpid()}", logging_level="ERROR", log_to_driver=False)
    client = rt.connect(address=args.address, deadline_s=120)
    spark = sc.init_spark(f"driver-{args.pipeline}-{os.getpid()}", executor_cores=1,
                          **{"spark.sql.shuffle.partitions": "2"})

    def before_commit(batch: int) -> None:
        print(f"COMMITTING {batch}", flush=True)
        time.sleep(args.pause)

    pipeline = sc.ExactlyOncePipeline(spark, client, args.source, "wc", args.sink, wordcount, args.pipeline,
                                      batch_max_messages=40, before_commit=before_commit)
    try:
        pipeline.run(until_idle=True, progress=False)
    except Fenced as e:
        print(f"FENCED {e}", flush=True)
        return 3
    print(f"DONE {len(pipeline.stats)}", flush=True)
    sc.stop_spark()
    return 0


if __name__ == "__main__":
    sys.exit(main())
