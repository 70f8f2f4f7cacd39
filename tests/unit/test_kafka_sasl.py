"""The gateway's SASL messages (pure): PLAIN and OAUTHBEARER parsing, a token's claims, and the
answers refused requests get (``security.refusal_fields`` encodes in every API it shapes)."""

from __future__ import annotations

import time

import pytest
from kafka.protocol.consumer import JoinGroupRequest, OffsetCommitRequest
from kafka.protocol.producer import ProduceRequest

from raytxn.auth import create_token, new_secret
from raytxn.kafka import sasl, security, wire


def test_plain_takes_username_and_token() -> None:
    assert sasl.parse("PLAIN", b"\x00alice\x00tok") == sasl.Credentials("tok", "alice")
    assert sasl.parse("PLAIN", b"alice\x00alice\x00tok") == sasl.Credentials("tok", "alice")
    for bad, why in ((b"alice\x00tok", "authzid NUL username"), (b"\x00\x00tok", "needs a username"),
                     (b"\x00alice\x00", "needs a username"), (b"bob\x00alice\x00tok", "differs"),
                     (b"\x00al\xffice\x00t", "not UTF-8")):
        with pytest.raises(sasl.SaslError, match=why):
            sasl.parse("PLAIN", bad)


def test_oauthbearer_takes_the_bearer_token() -> None:
    assert sasl.parse("OAUTHBEARER", b"n,,\x01auth=Bearer abc.def.ghi\x01\x01") == sasl.Credentials("abc.def.ghi")
    # extensions are ignored, the GS2 header may name an authzid
    assert sasl.parse("OAUTHBEARER", b"n,a=alice,\x01auth=Bearer t\x01x=1\x01\x01").token == "t"
    for bad, why in ((b"\x01", "ended the exchange"), (b"n,,\x01auth=Bearer t\x01", "must be"),
                     (b"p=x,,\x01auth=Bearer t\x01\x01", "channel binding"),
                     (b"n,,\x01auth=Basic t\x01\x01", "no 'auth=Bearer"), (b"n,,\x01auth\x01\x01", "malformed")):
        with pytest.raises(sasl.SaslError, match=why):
            sasl.parse("OAUTHBEARER", bad)
    with pytest.raises(sasl.SaslError, match="not served"):
        sasl.parse("SCRAM-SHA-256", b"x")
    with pytest.raises(sasl.SaslError, match="limit"):
        sasl.parse("PLAIN", b"x" * (sasl.MAX_SASL_BYTES + 1))


def test_a_tokens_expiry_is_read_from_its_claims() -> None:
    secret = new_secret()
    assert sasl.token_expiry_s(create_token(secret, "alice")) is None
    assert sasl.token_expiry_s(create_token(secret, "alice", expires_at_s=1234567890.5)) == 1234567890
    for bad in ("a.b", "a.!!!.c", "a.bnVsbA.c"):  # not three parts; not base64 JSON; JSON null
        with pytest.raises(sasl.SaslError):
            sasl.token_claims(bad)


def test_a_session_lives_until_its_token_expires() -> None:
    now = time.time()
    session = security.Session(True, principal="alice", expires_at_s=now + 2)
    assert session.authenticated and not session.expired(now) and session.expired(now + 2)
    assert 1900 <= session.lifetime_ms(now) <= 2000
    assert security.Session(True, principal="alice").lifetime_ms(now) == 0  # no exp: no limit


def encoded(api_key: int, version: int, fields: dict) -> bytes:
    return wire.encode_response(wire.RequestHeader(api_key, version, 7), **fields)


def test_refusals_fill_the_requests_error_fields() -> None:
    produce = ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="t", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=b"")])])
    fields = security.refusal_fields(0, produce, 9, security.TOPIC_AUTHORIZATION_FAILED, "'bob' has no produce")
    assert fields is not None
    assert security.refusal_codes(fields) == {security.TOPIC_AUTHORIZATION_FAILED}
    assert encoded(0, 9, fields)
    join = JoinGroupRequest[5](group_id="g", session_timeout_ms=1, rebalance_timeout_ms=1, member_id="",
                               group_instance_id=None, protocol_type="consumer", protocols=[])
    fields = security.refusal_fields(11, join, 5, security.GROUP_AUTHORIZATION_FAILED, "no")
    assert fields is not None and fields["error_code"] == security.GROUP_AUTHORIZATION_FAILED
    assert encoded(11, 5, fields)
    commit = OffsetCommitRequest[8](group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                    group_instance_id=None, topics=[
        OffsetCommitRequest.OffsetCommitRequestTopic(name=n, partitions=[
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata="")])
        for n in ("mine", "theirs")])
    fields = security.refusal_fields(8, commit, 8, security.TOPIC_AUTHORIZATION_FAILED, "no", {"theirs"})
    assert fields is not None
    codes = {t.name: t.partitions[0].error_code for t in fields["topics"]}
    assert codes == {"mine": security.OPERATION_NOT_ATTEMPTED, "theirs": security.TOPIC_AUTHORIZATION_FAILED}
    assert encoded(8, 8, fields)
    assert security.refusal_fields(99, object(), 0, security.SASL_AUTHENTICATION_FAILED, "no") is None
