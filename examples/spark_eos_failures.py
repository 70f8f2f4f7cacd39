"""Exactly-once Spark pipelines under failures: a Spark task that fails midway, an executor killed,
and a driver killed mid-batch and restarted (the restart fences the dead driver's transaction).
The jobs (``--job``):
- ``wordcount`` (the default): each batch's word counts; their sum is the plain-Python count;
- ``running``: running totals kept as keyed state in a compacted topic; the state's and the
  output's last total of each word are the plain-Python count;
- ``dedup``: a per-key dedup window kept as state; each event id passes exactly as often as the
  plain-Python rule lets it (once, and again after a window of silence).
Run: .venv/bin/python examples/spark_eos_failures.py [--job running|dedup]
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
from raytxn.connectors.dedup import dedup_window_spark, expected_dedup, passed_keys, sample_events
from raytxn.connectors.wordcount import expected_counts, running_wordcount_spark, sample_lines, total_counts, wordcount

JOBS = ("wordcount", "running", "dedup")
WINDOW_MS = 20_000  # the dedup window


def pipeline_args(job: str, sink: str) -> dict:
    """The job's transform, and its state topic when it keeps state."""
    if job == "wordcount":
        return {"transform": wordcount}
    transform = running_wordcount_spark if job == "running" else dedup_window_spark(WINDOW_MS)
    return {"transform": transform, "state_topic": f"{sink}-state"}


def driver(address: str, job: str, pipeline_id: str, source: str, sink: str, pause: float) -> int:
    """One driver process: runs the pipeline until its input is drained."""
    ray.init(address=address, namespace=f"driver-{os.getpid()}", logging_level="ERROR")
    client = rt.connect(address=address)
    spark = sc.init_spark(f"eos-driver-{os.getpid()}")

    def before_commit(batch: int) -> None:
        print(f"COMMITTING {batch}", flush=True)
        import time

        time.sleep(pause)

    sc.ExactlyOncePipeline(spark, client, source, "wc", sink, pipeline_id=pipeline_id, batch_max_messages=50,
                           before_commit=before_commit, **pipeline_args(job, sink)).run(until_idle=True,
                                                                                        progress=False)
    print("DONE", flush=True)
    return 0


def main(job: str) -> None:
    client = rt.connect()
    address = ray.get_runtime_context().gcs_address
    run = uuid.uuid4().hex[:6]
    source, sink = f"eos-{job}-in-{run}", f"eos-{job}-out-{run}"
    client.create_topic(source, 2)
    client.create_topic(sink, 2)
    if job != "wordcount":
        client.create_topic(f"{sink}-state", 2, compacted=True)
    lines = sample_lines(400)
    events = sample_events(400, WINDOW_MS)
    # Entries of 10 messages: a batch is cut at entry boundaries (an entry is never split), so the
    # 50-message batches come out near 50 and the faults below hit batches in the middle of the run.
    producer = client.create_producer(source, batching_max_messages=10)
    for i, line in enumerate(lines):
        if job == "dedup":  # an event id as the key (it picks the partition), its time as event time
            producer.send_async(f"event {events[i][0]}".encode(), key=events[i][0], event_time=events[i][1])
        else:
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

    pipeline = sc.ExactlyOncePipeline(spark, client, source, "wc", sink, pipeline_id=pipeline_id,
                                      batch_max_messages=50, write_fault=fail_once, before_commit=kill_executor,
                                      **pipeline_args(job, sink))
    stats = pipeline.run(max_batches=3, progress=False)
    print(f"phase 1: {len(stats)} batches committed despite task failures and an executor kill")
    sc.stop_spark()

    # 2. A driver process killed mid-batch, then a new one with the same pipeline id.
    argv = [sys.executable, __file__, "--job", job, "--driver", address, pipeline_id, source, sink]
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

    print(verdict(client, job, sink, lines, events))
    client.close()
    rt.shutdown()


def verdict(client: rt.Client, job: str, sink: str, lines: list[str], events: list[tuple[str, int]]) -> str:
    """The job's result beside the same computation in plain Python."""
    if job == "wordcount":
        totals = total_counts(client, sink, "verify")
        return (f"{sum(totals.values())} words counted; identical to the plain-Python count: "
                f"{totals == expected_counts(lines)}")
    expected = expected_counts(lines)
    if job == "running":
        with client.table_view(f"{sink}-state") as state, client.table_view(sink) as output:
            stored = {word: int(state.get(word)) for word in state}
            emitted = {word: int(output.get(word)) for word in output}
        return (f"{sum(stored.values())} words in the running totals; state identical to the plain-Python "
                f"count: {stored == expected}; last output identical: {emitted == expected}")
    passed = passed_keys(client, sink, "verify")
    return (f"{sum(passed.values())} of {len(events)} events passed the dedup window; identical to the "
            f"plain-Python rule: {passed == expected_dedup(events, WINDOW_MS)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", choices=JOBS, default="wordcount")
    parser.add_argument("--driver", nargs=5, metavar=("ADDRESS", "PIPELINE", "SOURCE", "SINK", "PAUSE"))
    args = parser.parse_args()
    if args.driver:
        address, pipeline_id, source, sink, pause = args.driver
        sys.exit(driver(address, args.job, pipeline_id, source, sink, float(pause)))
    main(args.job)
