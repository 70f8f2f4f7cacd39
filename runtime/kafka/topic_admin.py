"""The topic admin APIs: CreateTopics, DeleteTopics and DescribeConfigs of topics (what Kafka's
AdminClient, ``kafka-topics``, ``kafka-configs``, confluent-kafka's ``create_topics`` /
``delete_topics`` / ``describe_configs``, Kafka Connect's and Kafka Streams' internal topics call).

A Kafka topic is the raytxn topic of the same name (``mapping``), so these create, delete and
describe raytxn topics through the supervisor, with the connection's token: only a superuser may
create or delete (TOPIC_AUTHORIZATION_FAILED otherwise, as Kafka answers a principal without
CREATE or DELETE), as in the native client.

Topic configs (``parse_topic_configs``, pure):

* honoured: ``cleanup.policy`` (``delete``, raytxn's retention, or ``compact``: a compacted
  topic), ``retention.ms`` and ``retention.bytes`` (-1: unbounded). raytxn's retention is
  Pulsar's: it keeps data every subscription (every group) acknowledged for that long or up to
  that size; what a subscription has not acknowledged is kept whatever its age. And raytxn's own
  ``raytxn.compaction.threshold.bytes``, when a compacted topic compacts itself;
* accepted with no effect, because object storage does what they tune (replication, segment
  files, flushing): ``min.insync.replicas``, ``segment.*``, ``flush.*`` and the like
  (``STORAGE_COVERED``), ``message.timestamp.type=CreateTime`` and ``compression.type=producer``
  (what raytxn does anyway);
* anything else is INVALID_CONFIG naming the config, and nothing is created: a config that is
  silently ignored (``compact,delete``, ``min.compaction.lag.ms``, ``max.message.bytes``) would
  promise what raytxn does not do.

The replication factor is accepted as -1 or any positive number, since the replicas are the
object store's; explicit replica assignments are INVALID_REPLICA_ASSIGNMENT (there are no broker
replicas to assign). Topic ids are not served: CreateTopics v7 answers the zero id and
DeleteTopics v6 deletes by name (a request by id alone is UNKNOWN_TOPIC_ID).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import CreateTopicsResponse, DeleteTopicsResponse, DescribeConfigsResponse

from raytxn.errors import (
    InvalidArgument,
    InvalidTopicName,
    NotAuthorized,
    RaytxnError,
    TopicAlreadyExists,
    TopicNotFound,
)
from raytxn.kafka import mapping, wire
from raytxn.protocol.catalog import MAX_PARTITIONS
from raytxn.protocol.retention import DEFAULT_COMPACTION_THRESHOLD_BYTES

TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
UNKNOWN_TOPIC_ID = 100

# DescribeConfigs' resource types and config sources and types (Kafka's ConfigResource.Type,
# DescribeConfigsResponse.ConfigSource and ConfigDef.Type).
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
STRING_TYPE, LONG_TYPE = 2, 5

MAX_TOPICS_PER_REQUEST = 10_000  # topics one request may name (Kafka bounds it by the frame size only)
COMPACTION_THRESHOLD = "raytxn.compaction.threshold.bytes"
STORAGE_COVERED = frozenset({
    "min.insync.replicas", "unclean.leader.election.enable", "segment.bytes", "segment.ms",
    "segment.index.bytes", "segment.jitter.ms", "index.interval.bytes", "flush.messages", "flush.ms",
    "preallocate", "file.delete.delay.ms", "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas", "message.downconversion.enable",
})
ONLY_VALUE = {"message.timestamp.type": "CreateTime", "compression.type": "producer"}


@dataclass(frozen=True)
class TopicSettings:
    """A CreateTopics topic's configs, as raytxn's ``create_topic`` takes them."""

    compacted: bool = False
    retention_bytes: int | None = None
    retention_s: float | None = None
    compaction_threshold_bytes: int | None = None


class ConfigError(InvalidArgument):
    """A topic config raytxn does not serve, or a value it cannot take (INVALID_CONFIG)."""


def _limit(name: str, value: str) -> int | None:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if number < -1:
        raise ConfigError(f"{name}={value!r}: use -1 (unbounded) or a non-negative number")
    return None if number == -1 else number


def parse_topic_configs(configs: list[tuple[str, str | None]]) -> TopicSettings:
    """The settings of a CreateTopics topic's configs (``ConfigError`` naming the first config
    raytxn cannot honour; see the module)."""
    seen: dict[str, str] = {}
    for name, value in configs:
        if value is None:
            raise ConfigError(f"{name}: a null value is not a topic config")
        if name in seen:
            raise ConfigError(f"{name} is given twice")
        seen[name] = value
    compacted, retention_bytes, retention_s, threshold = False, None, None, None
    for name, value in seen.items():
        if name == "cleanup.policy":
            policies = {p.strip() for p in value.split(",")}
            if policies not in ({"delete"}, {"compact"}):
                raise ConfigError(f"cleanup.policy={value!r}: use delete or compact (compact with deletion "
                                  f"by time or size is not served)")
            compacted = policies == {"compact"}
        elif name == "retention.ms":
            ms = _limit(name, value)
            retention_s = None if ms is None else ms / 1000
        elif name == "retention.bytes":
            retention_bytes = _limit(name, value)
        elif name == COMPACTION_THRESHOLD:
            threshold = _limit(name, value)
        elif name in ONLY_VALUE:
            if value != ONLY_VALUE[name]:
                raise ConfigError(f"{name}={value!r} is not served (only {ONLY_VALUE[name]})")
        elif name not in STORAGE_COVERED:
            raise ConfigError(f"topic config {name!r} is not served by raytxn's gateway")
    if threshold is not None and not compacted:
        raise ConfigError(f"{COMPACTION_THRESHOLD} is for a compacted topic (cleanup.policy=compact)")
    if threshold == 0:
        raise ConfigError(f"{COMPACTION_THRESHOLD} must be positive (or -1: the default)")
    return TopicSettings(compacted, retention_bytes, retention_s, threshold)


def topic_configs(row: dict[str, Any]) -> list[tuple[str, str, bool, int]]:
    """A raytxn topic's configs as Kafka names them: (name, value, is_default, type), from the
    supervisor's topic row."""
    retention_s, retention_bytes = row.get("retention_s"), row.get("retention_bytes")
    compacted = bool(row.get("compacted"))
    rows = [("cleanup.policy", "compact" if compacted else "delete", not compacted, STRING_TYPE),
            ("retention.ms", "-1" if retention_s is None else str(round(retention_s * 1000)), retention_s is None,
             LONG_TYPE),
            ("retention.bytes", "-1" if retention_bytes is None else str(retention_bytes), retention_bytes is None,
             LONG_TYPE)]
    threshold = row.get("compaction_threshold_bytes")
    if compacted and threshold is not None:  # (the supervisor's rows of compacted topics always hold one)
        rows.append((COMPACTION_THRESHOLD, str(threshold), threshold == DEFAULT_COMPACTION_THRESHOLD_BYTES, LONG_TYPE))
    return rows


def _create_error(error: BaseException) -> int:
    if isinstance(error, TopicAlreadyExists):
        return TOPIC_ALREADY_EXISTS
    if isinstance(error, NotAuthorized):
        return wire.TOPIC_AUTHORIZATION_FAILED
    if isinstance(error, InvalidArgument) and not isinstance(error, InvalidTopicName):
        return INVALID_CONFIG
    return mapping.error_code(error)


# ``create(name, partitions, settings)``, ``delete(name)``, ``describe(name)`` (the topic row),
# ``forget(name)`` (drop the gateway's cached partition count) and ``may_administer()``: whether
# the connection's principal may create and delete topics (a superuser, or auth off).
Create = Callable[[str, int, TopicSettings], Awaitable[Any]]
Delete = Callable[[str], Awaitable[Any]]
Describe = Callable[[str], Awaitable[dict[str, Any]]]


class TopicAdmin:
    def __init__(self, create: Create, delete: Delete, describe: Describe, forget: Callable[[str], None],
                 may_administer: Callable[[], bool]) -> None:
        self._create, self._delete, self._describe = create, delete, describe
        self._forget, self._may_administer = forget, may_administer

    async def create_topics(self, request: Any, version: int) -> dict[str, Any]:
        names = [t.name for t in request.topics]
        duplicated = {n for n in names if names.count(n) > 1} if len(names) <= MAX_TOPICS_PER_REQUEST else set(names)
        results = []
        for topic in request.topics:
            if topic.name in duplicated:
                code, message = wire.INVALID_REQUEST, "the topic is named more than once in the request"
                results.append(self._created(topic.name, version, code, message))
                continue
            results.append(await self._create_one(topic, version, bool(getattr(request, "validate_only", False))))
        return {"throttle_time_ms": 0, "topics": results}

    async def _create_one(self, topic: Any, version: int, validate_only: bool) -> Any:
        name = topic.name
        try:
            mapping.raytxn_topic(name)
        except InvalidArgument as e:
            return self._created(name, version, wire.INVALID_TOPIC_EXCEPTION, str(e))
        if not self._may_administer():
            return self._created(name, version, wire.TOPIC_AUTHORIZATION_FAILED,
                                 "creating topics is for superusers (as in raytxn's own client)")
        refused = _shape_refusal(topic)
        if refused is not None:
            return self._created(name, version, *refused)
        try:
            settings = parse_topic_configs([(c.name, c.value) for c in topic.configs])
        except ConfigError as e:
            return self._created(name, version, INVALID_CONFIG, str(e))
        partitions = 1 if topic.num_partitions == -1 else topic.num_partitions  # Kafka's num.partitions
        planned = {"partitions": partitions, "compacted": settings.compacted, "retention_s": settings.retention_s,
                   "retention_bytes": settings.retention_bytes,
                   "compaction_threshold_bytes": settings.compaction_threshold_bytes}
        try:
            # raytxn's create_topic of a topic that exists with the same settings succeeds (a
            # retry's answer); Kafka's CreateTopics answers TOPIC_ALREADY_EXISTS, so look first.
            await self._describe(name)
            return self._created(name, version, TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        except TopicNotFound:
            pass
        except RaytxnError as e:
            return self._created(name, version, _create_error(e), str(e))
        if validate_only:
            return self._created(name, version, wire.NONE, None, planned, topic.replication_factor)
        try:
            await self._create(name, partitions, settings)
            self._forget(name)
            row = await self._describe(name)
        except TopicNotFound:  # deleted again at once: it was created as planned
            row = planned
        except RaytxnError as e:
            return self._created(name, version, _create_error(e), str(e))
        return self._created(name, version, wire.NONE, None, row, topic.replication_factor)

    @staticmethod
    def _created(name: str, version: int, code: int, message: str | None, row: dict[str, Any] | None = None,
                 replication_factor: int = -1) -> Any:
        shape = CreateTopicsResponse.CreatableTopicResult
        configs = None
        if row is not None:
            configs = [shape.CreatableTopicConfigs(name=n, value=v, read_only=True,
                                                   config_source=DEFAULT_CONFIG if default else DYNAMIC_TOPIC_CONFIG,
                                                   is_sensitive=False) for n, v, default, _ in topic_configs(row)]
        return shape(name=name, topic_id=uuid.UUID(int=0), error_code=code, error_message=message,
                     topic_config_error_code=wire.NONE,
                     num_partitions=-1 if row is None else int(row["partitions"]),
                     replication_factor=-1 if row is None else max(1, replication_factor), configs=configs)

    async def delete_topics(self, request: Any, version: int) -> dict[str, Any]:
        if version >= 6:
            asked: list[tuple[str | None, Any]] = [(t.name, t.topic_id) for t in request.topics]
        else:
            asked = [(n, None) for n in request.topic_names]
        results = []
        for name, topic_id in asked[:MAX_TOPICS_PER_REQUEST]:
            code, message = await self._delete_one(name)
            results.append(DeleteTopicsResponse.DeletableTopicResult(
                name=name, topic_id=topic_id or uuid.UUID(int=0), error_code=code, error_message=message))
        return {"throttle_time_ms": 0, "responses": results}

    async def _delete_one(self, name: str | None) -> tuple[int, str | None]:
        if name is None:
            return UNKNOWN_TOPIC_ID, "topic ids are not served: delete by name"
        try:
            mapping.raytxn_topic(name)
        except InvalidArgument as e:
            return wire.INVALID_TOPIC_EXCEPTION, str(e)
        if not self._may_administer():
            return wire.TOPIC_AUTHORIZATION_FAILED, "deleting topics is for superusers (as in raytxn's own client)"
        try:
            await self._describe(name)  # UNKNOWN_TOPIC_OR_PARTITION before anything is marked
            await self._delete(name)
        except RaytxnError as e:
            return mapping.error_code(e), str(e)
        finally:
            self._forget(name)
        return wire.NONE, None

    async def describe_configs(self, request: Any, version: int) -> dict[str, Any]:
        results = [await self._describe_resource(r, version) for r in request.resources[:MAX_TOPICS_PER_REQUEST]]
        return {"throttle_time_ms": 0, "results": results}

    async def _describe_resource(self, resource: Any, version: int) -> Any:
        shape = DescribeConfigsResponse.DescribeConfigsResult

        def answer(code: int, message: str | None, configs: list[Any]) -> Any:
            return shape(error_code=code, error_message=message, resource_type=resource.resource_type,
                         resource_name=resource.resource_name, configs=configs)

        if resource.resource_type == BROKER_RESOURCE:
            return answer(wire.NONE, None, [])  # no broker configs: the gateway is configured by its flags
        if resource.resource_type != TOPIC_RESOURCE:
            return answer(wire.INVALID_REQUEST, f"resource type {resource.resource_type} is not served", [])
        try:
            row = await self._describe(mapping.raytxn_topic(resource.resource_name))
        except RaytxnError as e:
            return answer(mapping.error_code(e), str(e), [])
        wanted = None if resource.configuration_keys is None else set(resource.configuration_keys)
        config = shape.DescribeConfigsResourceResult
        configs = [config(name=n, value=v, read_only=True, is_default=default,
                          config_source=DEFAULT_CONFIG if default else DYNAMIC_TOPIC_CONFIG, is_sensitive=False,
                          synonyms=[], config_type=kind, documentation=None)
                   for n, v, default, kind in topic_configs(row) if wanted is None or n in wanted]
        return answer(wire.NONE, None, configs)


def _shape_refusal(topic: Any) -> tuple[int, str] | None:
    """Kafka's checks of a CreateTopics topic's partitions, replication and assignments."""
    if topic.assignments:
        return INVALID_REPLICA_ASSIGNMENT, "replica assignments are not served: object storage holds the replicas"
    if topic.num_partitions != -1 and not 1 <= topic.num_partitions <= MAX_PARTITIONS:
        return INVALID_PARTITIONS, f"num_partitions must be -1 or 1..{MAX_PARTITIONS}, got {topic.num_partitions}"
    if topic.replication_factor == 0 or topic.replication_factor < -1:
        return INVALID_REPLICATION_FACTOR, f"replication factor must be -1 or positive, got {topic.replication_factor}"
    return None


def refusal_fields(api_key: int, request: Any, version: int, code: int, message: str) -> dict[str, Any] | None:
    """The answer of a refused CreateTopics, DeleteTopics or DescribeConfigs (``security``)."""
    if api_key == 19:
        return {"throttle_time_ms": 0, "topics": [TopicAdmin._created(t.name, version, code, message)
                                                  for t in request.topics]}
    if api_key == 20:
        names = [t.name for t in request.topics] if version >= 6 else list(request.topic_names)
        return {"throttle_time_ms": 0, "responses": [DeleteTopicsResponse.DeletableTopicResult(
            name=n, topic_id=uuid.UUID(int=0), error_code=code, error_message=message) for n in names]}
    if api_key == 32:
        shape = DescribeConfigsResponse.DescribeConfigsResult
        return {"throttle_time_ms": 0, "results": [shape(
            error_code=code, error_message=message, resource_type=r.resource_type, resource_name=r.resource_name,
            configs=[]) for r in request.resources]}
    return None
