"""The gateway's security pieces that need no engine: a connection's SASL session, the TLS
context of the listener, and the shape of a refused request's answer.

Refusals answer in the request's own error fields, so a Kafka client reports a named error
(librdkafka: "Broker: Topic authorization failed") instead of a bare disconnect; an API whose
answer has no place for one is refused by closing the connection, as Kafka does for a request
it will not serve before authentication.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import DeleteGroupsResponse, DescribeGroupsResponse
from kafka.protocol.consumer import (
    FetchResponse,
    ListOffsetsResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import AddPartitionsToTxnResponse, ProduceResponse, TxnOffsetCommitResponse

# Kafka's error codes for refusals (Kafka's ``Errors``).
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_SASL_MECHANISM = 33
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OPERATION_NOT_ATTEMPTED = 55
SASL_AUTHENTICATION_FAILED = 58

# The refusal counters' names (``served["refused"]``), one per Kafka error a refusal answers (no
# request is answered CLUSTER_AUTHORIZATION_FAILED, so it has none).
REASONS = {
    SASL_AUTHENTICATION_FAILED: "sasl_authentication_failed",
    TOPIC_AUTHORIZATION_FAILED: "topic_authorization_failed",
    GROUP_AUTHORIZATION_FAILED: "group_authorization_failed",
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional_id_authorization_failed",
    ILLEGAL_SASL_STATE: "illegal_sasl_state",
    UNSUPPORTED_SASL_MECHANISM: "unsupported_sasl_mechanism",
}
SESSION_EXPIRED = "session_expired"  # the reason of a connection closed at its token's expiry
UNAUTHENTICATED_CLOSED = "unauthenticated_closed"  # an unauthenticated request with no error field

# What a connection may send before it authenticated (with auth on): ApiVersions (18),
# SaslHandshake (17) and SaslAuthenticate (36), as on a Kafka SASL listener.
PRE_AUTH_APIS = frozenset({17, 18, 36})
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


@dataclass
class Session:
    """A connection's authentication. ``auth_on``: the engine has auth on (then nothing but
    ``PRE_AUTH_APIS`` is served until ``principal`` is set). ``mechanism``: the one SaslHandshake
    chose, awaiting its SaslAuthenticate (or, after a v0 handshake, the raw SASL frame:
    ``raw_sasl``). ``expires_at_s``: the token's ``exp``; past it the connection is closed."""

    auth_on: bool
    principal: str | None = None
    token: str | None = None
    superuser: bool = False
    expires_at_s: float | None = None
    mechanism: str | None = None
    raw_sasl: bool = False

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def expired(self, now_s: float) -> bool:
        return self.expires_at_s is not None and now_s >= self.expires_at_s

    def lifetime_ms(self, now_s: float) -> int:
        """KIP-368's session_lifetime_ms: until the token expires (0: no limit)."""
        if self.expires_at_s is None:
            return 0
        return max(1, int((self.expires_at_s - now_s) * 1000))


# --- refusals ----------------------------------------------------------------------------------


def _partitions(topics: Any, attr: str = "partitions") -> list[tuple[str, list[int]]]:
    return [(t.name, [p if isinstance(p, int) else p.partition_index for p in getattr(t, attr)]) for t in topics]


def refusal_fields(api_key: int, request: Any, version: int, code: int, message: str,
                   only_topics: set[str] | None = None) -> dict[str, Any] | None:
    """The answer of a refused request: ``code`` in every error field of the request's answer
    (``only_topics``: in those topics' fields, the others getting OPERATION_NOT_ATTEMPTED where
    the API has it); None when the API's answer has no error field (close the connection)."""

    def code_for(topic: str) -> int:
        return code if only_topics is None or topic in only_topics else OPERATION_NOT_ATTEMPTED

    base = {"throttle_time_ms": 0}
    if api_key == 0:  # Produce
        shape = ProduceResponse.TopicProduceResponse
        return {**base, "responses": [shape(name=t.name, partition_responses=[
            shape.PartitionProduceResponse(index=d.index, error_code=code, base_offset=-1, log_append_time_ms=-1,
                                           log_start_offset=-1, record_errors=[], error_message=message)
            for d in t.partition_data]) for t in request.topic_data]}
    if api_key == 1:  # Fetch
        shape = FetchResponse.FetchableTopicResponse
        return {**base, "error_code": code, "session_id": 0, "responses": [shape(topic=t.topic, partitions=[
            shape.PartitionData(partition_index=p.partition, error_code=code, high_watermark=-1,
                                last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                                preferred_read_replica=-1, records=b"") for p in t.partitions])
            for t in request.topics]}
    if api_key == 2:  # ListOffsets
        shape = ListOffsetsResponse.ListOffsetsTopicResponse
        return {**base, "topics": [shape(name=t.name, partitions=[shape.ListOffsetsPartitionResponse(
            partition_index=p.partition_index, error_code=code, timestamp=-1, offset=-1, leader_epoch=-1)
            for p in t.partitions]) for t in request.topics]}
    if api_key == 3:  # Metadata: every topic asked for refused (none listed for "all topics")
        names = [t.name for t in request.topics or []]
        return {**base, "brokers": [], "cluster_id": None, "controller_id": -1, "topics": [
            MetadataResponse.MetadataResponseTopic(error_code=code, name=n, is_internal=False, partitions=[])
            for n in names]}
    if api_key == 10:  # FindCoordinator
        keys = request.coordinator_keys or [request.key]
        return {**base, "error_code": code, "error_message": message, "node_id": -1, "host": "", "port": -1,
                "coordinators": [FindCoordinatorResponse.Coordinator(key=k, node_id=-1, host="", port=-1,
                                                                     error_code=code, error_message=message)
                                 for k in keys]}
    if api_key in (22,):  # InitProducerId
        return {**base, "error_code": code, "producer_id": -1, "producer_epoch": -1}
    if api_key in (11, 12, 13, 14, 16, 25, 26, 47):  # one error code: groups, EndTxn, AddOffsetsToTxn...
        fields: dict[str, Any] = {**base, "error_code": code}
        if api_key == 11:
            fields.update(generation_id=-1, member_id=request.member_id, leader="", members=[],
                          protocol_name=None if version >= 7 else "")
        if api_key == 13:
            fields["members"] = []
        if api_key == 14:
            fields["assignment"] = b""
        if api_key == 16:
            fields["groups"] = []
        if api_key == 47:
            fields["topics"] = []
        return fields
    if api_key == 24:  # AddPartitionsToTxn (v0-3)
        shape = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
        return {**base, "results_by_topic_v3_and_below": [shape(name=t.name, results_by_partition=[
            shape.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=code_for(t.name))
            for p in t.partitions]) for t in request.v3_and_below_topics]}
    if api_key in (8, 28):  # OffsetCommit, TxnOffsetCommit
        response = OffsetCommitResponse if api_key == 8 else TxnOffsetCommitResponse
        shape = getattr(response, "OffsetCommitResponseTopic" if api_key == 8 else "TxnOffsetCommitResponseTopic")
        part = getattr(shape, "OffsetCommitResponsePartition" if api_key == 8 else "TxnOffsetCommitResponsePartition")
        return {**base, "topics": [shape(name=name, partitions=[part(partition_index=i, error_code=code_for(name))
                                                                for i in indexes])
                                   for name, indexes in _partitions(request.topics)]}
    if api_key == 9:  # OffsetFetch (v1-7)
        shape = OffsetFetchResponse.OffsetFetchResponseTopic
        topics = [] if request.topics is None else [shape(name=t.name, partitions=[
            shape.OffsetFetchResponsePartition(partition_index=i, committed_offset=-1, committed_leader_epoch=-1,
                                               metadata="", error_code=code_for(t.name))
            for i in t.partition_indexes]) for t in request.topics]
        return {**base, "topics": topics, "error_code": code if only_topics is None else 0}
    if api_key == 15:  # DescribeGroups
        shape = DescribeGroupsResponse.DescribedGroup
        return {**base, "groups": [shape(error_code=code, error_message=message, group_id=g, group_state="",
                                         protocol_type="", protocol_data="", members=[],
                                         authorized_operations=None) for g in request.groups]}
    if api_key == 42:  # DeleteGroups
        return {**base, "results": [DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=code)
                                    for g in request.groups_names]}
    from raytxn.kafka import topic_admin  # (it imports mapping, which this module must not)

    return topic_admin.refusal_fields(api_key, request, version, code, message)


# --- TLS ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _pem_file(pem: bytes) -> Iterator[str]:
    """``pem`` in a private temporary file (ssl loads certificates and keys from files only)."""
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp's file is 0600: the key is not readable by others
            f.write(pem)
        yield path
    finally:
        os.unlink(path)


def tls_context(cert_pem: bytes, key_pem: bytes, client_ca_pem: bytes | None = None) -> ssl.SSLContext:
    """The listener's TLS context (TLS 1.2+): ``cert_pem`` (the chain) and ``key_pem``; with
    ``client_ca_pem`` every client must present a certificate that CA signed (mTLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with _pem_file(cert_pem) as cert, _pem_file(key_pem) as key:
        context.load_cert_chain(cert, key)
    if client_ca_pem is not None:
        context.load_verify_locations(cadata=client_ca_pem.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


_ERROR_FIELDS = ("error_code", "partition_error_code")
_MAX_WALK = 100_000  # error fields looked at in one answer (answers are bounded by their request)


def refusal_codes(fields: dict[str, Any]) -> set[int]:
    """The refusal codes (``REASONS``) anywhere in a response's fields: what the engine's actors
    refused inside a request that went on (a produce to a topic without permission)."""
    found: set[int] = set()
    stack: list[Any] = list(fields.items())
    seen = 0
    while stack and seen < _MAX_WALK:
        seen += 1
        name, value = stack.pop()
        if name in _ERROR_FIELDS and value in REASONS:
            found.add(value)
        elif isinstance(value, list):
            stack.extend((None, v) for v in value)
        elif hasattr(value, "_struct") and value._struct is not None:
            stack.extend((f, getattr(value, f, None)) for f in value._struct.fields)
    return found
