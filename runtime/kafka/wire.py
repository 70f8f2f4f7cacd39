"""The Kafka wire layer: size-prefixed frames, request headers, and which APIs and versions this
gateway serves (``SERVED``). The encodings themselves are kafka-python's ``kafka.protocol``
messages, generated from Kafka's JSON schemas, so no byte layout is written by hand here.

A request for an API or a version not in ``SERVED`` is answered as Kafka brokers do: ApiVersions
with UNSUPPORTED_VERSION (and the versions served, so the client can pick), anything else by
closing the connection after logging why (``Unsupported``): a Kafka client only sends what the
ApiVersions answer offered, so that only happens to a client that ignores it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from raytxn.errors import InvalidArgument

# Kafka error codes used here (Kafka's ``Errors``).
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
OFFSET_METADATA_TOO_LARGE = 12
REQUEST_TIMED_OUT = 7
NOT_ENOUGH_REPLICAS = 19
COORDINATOR_NOT_AVAILABLE = 15
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
CONCURRENT_TRANSACTIONS = 51
UNSUPPORTED_COMPRESSION_TYPE = 76
UNSTABLE_OFFSET_COMMIT = 88
GROUP_SUBSCRIBED_TO_TOPIC = 86
UNKNOWN_SERVER_ERROR = -1
INVALID_RECORD = 87
# Each code above by its name, for stats and logs (built here: only the codes are defined yet).
ERROR_NAMES = {code: name for name, code in list(globals().items()) if name.isupper() and isinstance(code, int)}


@dataclass(frozen=True)
class Api:
    """One API served: its request and response messages and the versions served."""

    key: int
    request: Any
    response: Any
    min_version: int
    max_version: int


# What this gateway serves, by API key. Versions: Produce from 3 and Fetch from 4 (record batches,
# magic 2, and isolation levels), Fetch to 12 (13 addresses topics by id), Metadata to 9 (10 adds
# topic ids), FindCoordinator to 3 (4 batches keys), InitProducerId to 4, AddPartitionsToTxn to 3
# (4 is the brokers' batched form), EndTxn to 3. Groups: JoinGroup to 7, SyncGroup to 5, Heartbeat
# to 4, LeaveGroup to 4 (5 adds a reason), OffsetCommit 2-8 (9 is KIP-848's, 10 topic ids),
# OffsetFetch 1-7 (8 batches groups), AddOffsetsToTxn 0-3, TxnOffsetCommit 0-3 (4 is KIP-890's).
# Group admin: ListGroups 0-4 (5 filters by KIP-848 group type), DescribeGroups 0-5 (6 answers
# GROUP_ID_NOT_FOUND where 0-5 answer Dead), DeleteGroups 0-2, OffsetDelete 0 (its only version).
# Clients negotiate: confluent-kafka 2.16 (librdkafka) sends JoinGroup 5, SyncGroup 3, Heartbeat 3,
# LeaveGroup 1, OffsetCommit 8, OffsetFetch 7, TxnOffsetCommit 3, AddOffsetsToTxn 0; kafka-python
# 3.0 JoinGroup 7, SyncGroup 5, OffsetCommit 8, OffsetFetch 7.
SERVED: dict[int, Api] = {api.key: api for api in (
    Api(18, ApiVersionsRequest, ApiVersionsResponse, 0, 3),
    Api(3, MetadataRequest, MetadataResponse, 0, 9),
    Api(10, FindCoordinatorRequest, FindCoordinatorResponse, 0, 3),
    Api(2, ListOffsetsRequest, ListOffsetsResponse, 1, 7),
    Api(0, ProduceRequest, ProduceResponse, 3, 9),
    Api(1, FetchRequest, FetchResponse, 4, 12),
    Api(22, InitProducerIdRequest, InitProducerIdResponse, 0, 4),
    Api(24, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 3),
    Api(26, EndTxnRequest, EndTxnResponse, 0, 3),
    Api(11, JoinGroupRequest, JoinGroupResponse, 0, 7),
    Api(14, SyncGroupRequest, SyncGroupResponse, 0, 5),
    Api(12, HeartbeatRequest, HeartbeatResponse, 0, 4),
    Api(13, LeaveGroupRequest, LeaveGroupResponse, 0, 4),
    Api(8, OffsetCommitRequest, OffsetCommitResponse, 2, 8),
    Api(9, OffsetFetchRequest, OffsetFetchResponse, 1, 7),
    Api(25, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3),
    Api(28, TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3),
    Api(16, ListGroupsRequest, ListGroupsResponse, 0, 4),
    Api(15, DescribeGroupsRequest, DescribeGroupsResponse, 0, 5),
    Api(42, DeleteGroupsRequest, DeleteGroupsResponse, 0, 2),
    Api(47, OffsetDeleteRequest, OffsetDeleteResponse, 0, 0),
    # Transaction admin (KIP-664, ``txn_admin``): DescribeProducers 0, DescribeTransactions 0,
    # ListTransactions 0-2 (1 filters by duration, 2 by an id pattern).
    Api(61, DescribeProducersRequest, DescribeProducersResponse, 0, 0),
    Api(65, DescribeTransactionsRequest, DescribeTransactionsResponse, 0, 0),
    Api(66, ListTransactionsRequest, ListTransactionsResponse, 0, 2),
    # Topic admin (``topic_admin``): CreateTopics 2-7 (Kafka 4's floor; 7 answers a topic id),
    # DeleteTopics 1-6 (6 may name topics by id, which are not served), DescribeConfigs 1-4.
    Api(19, CreateTopicsRequest, CreateTopicsResponse, 2, 7),
    Api(20, DeleteTopicsRequest, DeleteTopicsResponse, 1, 6),
    Api(32, DescribeConfigsRequest, DescribeConfigsResponse, 1, 4),
    # SASL (the gateway's ``security``): handshake v0 (raw SASL frames follow) and v1
    # (SaslAuthenticate follows), SaslAuthenticate 0-2 (1 adds KIP-368's session lifetime).
    Api(17, SaslHandshakeRequest, SaslHandshakeResponse, 0, 1),
    Api(36, SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2),
)}
API_VERSIONS = 18
MAX_FRAME_BYTES = 100 << 20  # Kafka's socket.request.max.bytes
# Versions advertised below the served ones (KAFKA-18659): librdkafka before 2.8 enables gzip,
# snappy and lz4 only when the broker lists Produce v0, and silently sends uncompressed batches
# otherwise (librdkafka #4956; Debian's kcat links librdkafka 2.0). Kafka 4.0 advertises Produce
# v0-v2 and refuses them; clients pick the highest common version, so none sends them.
ADVERTISED_MIN_VERSIONS = {0: 0}


class Unsupported(InvalidArgument):
    """A request for an API or version this gateway does not serve (the connection is closed)."""


class Malformed(InvalidArgument):
    """A request whose header or body does not parse (the connection is closed: Kafka's rule,
    as no answer can be addressed to the parts of a request that could not be read)."""


class FrameTooLarge(InvalidArgument):
    """A frame prefix announcing more than ``MAX_FRAME_BYTES``, or a size below one header."""


# Why a connection was closed, as the gateway's ``served`` stats count them ("closed_<reason>").
CLOSE_REASONS = ("unsupported", "malformed", "oversized", "invalid", "connection", "login_failed", "internal_error")


class LoginFailed(Exception):
    """A v0 (raw) SASL exchange failed: the connection is closed (v0 has no error field)."""


def close_reason(error: BaseException) -> str:
    """The ``CLOSE_REASONS`` entry for the error that ended a connection."""
    if isinstance(error, LoginFailed):
        return "login_failed"
    if isinstance(error, Unsupported):
        return "unsupported"
    if isinstance(error, Malformed):
        return "malformed"
    if isinstance(error, FrameTooLarge):
        return "oversized"
    if isinstance(error, InvalidArgument):
        return "invalid"
    if isinstance(error, ConnectionError):
        return "connection"
    return "internal_error"


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int


_HEADER = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")


def frame_size(prefix: bytes) -> int:
    """The payload size a 4-byte frame prefix announces; ``InvalidArgument`` past the limit."""
    (size,) = _SIZE.unpack(prefix)
    if not 0 < size <= MAX_FRAME_BYTES:
        raise FrameTooLarge(f"Kafka frame of {size} bytes (limit {MAX_FRAME_BYTES})")
    return size


def peek_header(payload: bytes) -> RequestHeader:
    """API key, version and correlation id: the part of every request header that never changes."""
    if len(payload) < _HEADER.size:
        raise Malformed(f"Kafka request of {len(payload)} bytes has no header")
    return RequestHeader(*_HEADER.unpack_from(payload))


def decode_request(header: RequestHeader, payload: bytes) -> Any:
    """The request message; ``Unsupported`` for an API or version not served."""
    api = SERVED.get(header.api_key)
    if api is None:
        raise Unsupported(f"Kafka API key {header.api_key} is not served by this gateway")
    if not api.min_version <= header.api_version <= api.max_version:
        raise Unsupported(f"{api.request.name} v{header.api_version} is not served "
                          f"(v{api.min_version}-{api.max_version} are)")
    try:
        return api.request[header.api_version].decode(payload, header=True)
    except Exception as e:  # kafka-python's decoders raise struct.error, ValueError...
        raise Malformed(f"{api.request.name} v{header.api_version} of {len(payload)} bytes does not parse: "
                        f"{type(e).__name__}: {e}") from e


def encode_response(header: RequestHeader, **fields: Any) -> bytes:
    """The framed response to ``header``'s request, in the request's version."""
    api = SERVED[header.api_key]
    response = api.response[header.api_version](**fields)
    response.with_header(correlation_id=header.correlation_id)
    return bytes(response.encode(header=True, framed=True))


def api_versions(header: RequestHeader) -> bytes:
    """The ApiVersions answer: the table above; UNSUPPORTED_VERSION in v0 for a version past it
    (Kafka's rule, so that any client can read it and retry with one served)."""
    keys = [ApiVersionsResponse.ApiVersion(api_key=a.key, min_version=ADVERTISED_MIN_VERSIONS.get(a.key, a.min_version),
                                           max_version=a.max_version) for a in SERVED.values()]
    api = SERVED[API_VERSIONS]
    if not api.min_version <= header.api_version <= api.max_version:
        header = RequestHeader(API_VERSIONS, 0, header.correlation_id)
        return encode_response(header, error_code=UNSUPPORTED_VERSION, api_keys=keys)
    return encode_response(header, error_code=NONE, api_keys=keys, throttle_time_ms=0)
