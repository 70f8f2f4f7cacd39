"""The processes of this run's local Ray and the CPU time they spend, for benchmarks and profiles
that say where a run's CPU went (``profile_peers``, ``bench_gateways``, ``bench_gateway_memory``)."""

from __future__ import annotations

import psutil
import ray

SKIPPED = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")  # Ray's own, not the engine's


def ray_processes() -> dict[str, int]:
    """This run's Ray worker processes by their title (``ray::KafkaGateway``, ``ray::ActorHost``
    ...), numbered where one title has several; only children of this driver's own raylet, so
    other Ray instances on the machine are never sampled."""
    node = ray._private.worker._global_node  # the raylet of this driver's local Ray
    raylet = node.all_processes["raylet"][0].process.pid
    found: dict[str, int] = {}
    for proc in psutil.Process(raylet).children(recursive=True):
        try:
            title = proc.cmdline()[0].split(".")[0].split(" ")[0] if proc.cmdline() else ""
        except psutil.Error:
            continue
        if not title.startswith("ray::") or title in SKIPPED:
            continue
        name, n = title[5:], 2
        while name in found:
            name, n = f"{title[5:]}#{n}", n + 1
        found[name] = proc.pid
    return found


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has spent so far; 0.0 for a process that is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy so far (all processes, anyone's)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)
