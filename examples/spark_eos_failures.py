"""The exactly-once word count under failures: a Spark task that fails midway, an executor killed,
and a driver killed mid-batch and restarted (the restart fences the dead driver's transaction).
The final counts are identical to the plain-Python count.
Run: .venv/bin/python examples/spark_eos_failures.py
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid

import ray

import raytxn as rt
from raytxn.connectors import spark as sc
from raytxn.connectors.wordcount import expected_counts, sample_lines, total_counts, wordcount


def driver(address: str, pipeline_id: str, source: str, sink: str, pause: float) -> int:
    """One driver process: runs the pipeline until its input is drained."""
    ray.init(address=address, namespace=f"driver-{os.getpid()}", logging_level="ERROR")
    client = rt.connect(address=address)
    spark = sc.init_spark(f"eos-driver-{os.getpid()}")

    def before_commit(batch: int) -> None:
        print(f"COMMITTING {batch}", flush=True)
        import time

        time.sleep(pause)

    sc.ExactlyOncePipeline(spark, client, source, "wc", sink, wordcount, pipeline_id, batch_max_messages=50,
                           before_commit=before_commit).run(until_idle=True, progress=False)
    print("DONE", flush=True)
    return 0


def main() -> None:
    client = rt.connect()
    address = ray.get_runtime_context().gcs_address
    run = uuid.uuid4().hex[:6]
    source, sink = f"eos-lines-{run}", f"eos-counts-{run}"
    client.create_topic(source, 2)
    client.create_topic(sink, 2)
    lines = sample_lines(400)
    producer = client.create_producer(source)
    for i, line in enumerate(lines):
        producer.send_async(line.encode(), key=str(i))
    producer.flush()
    pipeline_id = f"eos-{run}"

    # 1. In this driver: a task fails after writing part of its rows; an executor is killed.
    spark = sc.init_spark("eos-main")
    killed: list[str] = []

    def fail_once(spark_partition: int, attempt: int, rows_sent: int) -> None:
        if attempt == 0 and spark_partition == 0:
            raise RuntimeError("injected: task fails after writing")

    def kill_executor(batch: int) -> None:
        if batch == 1 and not killed:
            for actor in ray.util.list_named_actors(all_namespaces=True):
                if actor["name"].startswith("raydp-executor-"):
                    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=False)
                    killed.append(actor["name"])
                    print(f"killed Spark executor {actor['name']}")
                    break

    pipeline = sc.ExactlyOncePipeline(spark, client, source, "wc", sink, wordcount, pipeline_id, batch_max_messages=50,
                                      write_fault=fail_once, before_commit=kill_executor)
    stats = pipeline.run(max_batches=3, progress=False)
    print(f"phase 1: {len(stats)} batches committed despite task failures and an executor kill")
    sc.stop_spark()

    # 2. A driver process killed mid-batch, then a new one with the same pipeline id.
    argv = [sys.executable, __file__, "--driver", address, pipeline_id, source, sink]
    first = subprocess.Popen([*argv, "2"], stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("COMMITTING"):
            os.kill(first.pid, signal.SIGKILL)
            print("killed the driver process mid-batch (its transaction is open)")
            break
    first.wait()
    second = subprocess.run([*argv, "0"], capture_output=True, text=True)
    print(f"restarted driver: {second.stdout.strip().splitlines()[-1] if second.stdout else second.returncode}")

    totals = total_counts(client, sink, "verify")
    print(f"{sum(totals.values())} words counted; identical to the plain-Python count: "
          f"{totals == expected_counts(lines)}")
    client.close()
    rt.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", nargs=5, metavar=("ADDRESS", "PIPELINE", "SOURCE", "SINK", "PAUSE"))
    args = parser.parse_args()
    if args.driver:
        address, pipeline_id, source, sink, pause = args.driver
        sys.exit(driver(address, pipeline_id, source, sink, float(pause)))
    main()
