"""The optional parts of raytxn and the extras that install them.

The core install (``pip install raytxn``) runs the native client and engine: connect, produce,
consume, transactions, Ray Data, the CLI. Spark on Ray and the Kafka-protocol gateway need
libraries most users do not want (pyspark and RayDP are hundreds of MB), so they come with
extras; a module of such a part imports its libraries through ``import_extra`` and a missing one
raises ``MissingExtra`` naming the extra, instead of a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from raytxn.errors import MissingExtra

# extra -> (what it serves, the top-level modules it installs)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "spark": ("Spark on Ray (raytxn.connectors.spark)", ("pyspark", "raydp")),
    "kafka": ("the Kafka-protocol gateway (raytxn.kafka)", ("kafka", "cramjam")),
    "bench": ("the benchmarks (their chart, the Kafka bench's client)", ("matplotlib", "confluent_kafka")),
    # Ray's own `serve` extra: ray.serve ships in every Ray, its HTTP stack does not
    "console": ("the operations console (raytxn console)", ("starlette", "uvicorn", "jinja2")),
    "serve": ("Ray Serve (raytxn.aio in a Serve deployment, `raytxn bench aio`)", ("fastapi", "uvicorn", "starlette")),
}


def missing_extra(extra: str, module: str) -> MissingExtra:
    """The error for ``module`` (of ``extra``) not being installed."""
    serves, _ = EXTRAS[extra]
    return MissingExtra(f"{serves} needs the optional dependency {module!r}, which is not installed: "
                        f"pip install 'raytxn[{extra}]'", extra, module)


def import_extra(module: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or ``MissingExtra`` naming ``extra`` when the
    module's top-level package is not installed (an ImportError inside an installed package is
    a real error and passes through)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == module.split(".")[0]:
            raise missing_extra(extra, module.split(".")[0]) from e
        raise


def require_extra(extra: str) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` can be imported (found on the
    path; nothing is imported)."""
    _, modules = EXTRAS[extra]
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise missing_extra(extra, module)
