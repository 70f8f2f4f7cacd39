"""Tokens, the authorizer, guarded methods, catalog permissions and transactional-id ownership
(pure: no Ray)."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.auth import (
    ENGINE_PRINCIPAL,
    Access,
    AuthConfig,
    Authorizer,
    AuthTarget,
    check_principal,
    create_token,
    guarded,
    new_secret,
)
from raytxn.errors import AuthenticationFailed, InvalidArgument, NotAuthorized, TopicNotFound
from raytxn.protocol.catalog import Catalog, EntryState, decode_catalog, encode_catalog
from raytxn.protocol.coordinator_state import CoordinatorState

SECRET = "s" * 32


def authorizer(**kw: object) -> Authorizer:
    return Authorizer(AuthConfig(secret=SECRET, **kw))


def test_token_round_trip_names_the_principal() -> None:
    token = create_token(SECRET, "alice")
    assert authorizer().authenticate(token, now_s=0) == "alice"


@given(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._@-]{0,40}\Z"))
def test_any_valid_principal_round_trips(principal: str) -> None:
    assert authorizer().authenticate(create_token(SECRET, principal), now_s=0) == principal


def test_forged_expired_and_malformed_tokens_fail() -> None:
    auth = authorizer()
    with pytest.raises(AuthenticationFailed, match="invalid token"):
        auth.authenticate(create_token("x" * 32, "alice"), now_s=0)  # signed with another secret
    token = create_token(SECRET, "alice", expires_at_s=100)
    assert auth.authenticate(token, now_s=99) == "alice"
    with pytest.raises(AuthenticationFailed, match="expired"):
        auth.authenticate(token, now_s=100)  # also once it sits in the cache
    for bad in (None, "", "abc", "a.b.c", 42):
        with pytest.raises(AuthenticationFailed):
            auth.authenticate(bad, now_s=0)


def _unsigned(claims: dict) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def test_alg_none_and_tampered_claims_are_refused() -> None:
    auth = authorizer(superusers=("admin",))
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(_unsigned({"sub": "admin"}), now_s=0)
    header, _claims, signature = create_token(SECRET, "alice").split(".")
    forged = base64.urlsafe_b64encode(json.dumps({"sub": "admin"}).encode()).rstrip(b"=").decode()
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(f"{header}.{forged}.{signature}", now_s=0)


def test_permissions_superusers_and_the_engine() -> None:
    auth = authorizer(superusers=("root",))
    granted = {"alice": ["produce"], "bob": ["consume", "produce"]}
    auth.authorize("alice", Access.PRODUCE, granted)
    auth.authorize("bob", Access.CONSUME, granted)
    with pytest.raises(NotAuthorized, match="no consume permission"):
        auth.authorize("alice", Access.CONSUME, granted)
    with pytest.raises(NotAuthorized):
        auth.authorize("carol", Access.PRODUCE, granted)
    with pytest.raises(NotAuthorized, match="not a superuser"):
        auth.authorize("alice", Access.SUPERUSER)
    for who in ("root", ENGINE_PRINCIPAL):
        auth.authorize(who, Access.SUPERUSER)
        auth.authorize(who, Access.CONSUME, {})
    auth.authorize("carol", Access.AUTHENTICATED)
    assert auth.authenticate(auth.engine_token(), 0) == ENGINE_PRINCIPAL
    assert Authorizer(AuthConfig()).engine_token() is None


def test_config_validation_and_the_public_view() -> None:
    with pytest.raises(InvalidArgument):
        AuthConfig(secret="short")
    with pytest.raises(InvalidArgument):
        AuthConfig(superusers=("bad name",))
    with pytest.raises(InvalidArgument, match="at least one superuser"):
        AuthConfig(secret=new_secret(), superusers=())
    config = AuthConfig(secret=new_secret())
    assert config.enabled and config.public().enabled and config.public().secret is None
    assert not AuthConfig().enabled
    with pytest.raises(InvalidArgument):
        check_principal("-starts-with-dash")
    with pytest.raises(InvalidArgument):
        create_token(SECRET, "has space")


class _Target(AuthTarget):
    def __init__(self, config: AuthConfig, granted: dict[str, list[str]]) -> None:
        self.authorizer = Authorizer(config)
        self.granted = granted
        self.fetches = 0

    async def _topic_permissions(self) -> dict[str, list[str]]:
        self.fetches += 1
        return self.granted

    @guarded(Access.PRODUCE)
    async def append(self, value: int, caller: str | None = None) -> tuple[int, str | None]:
        return value, caller

    @guarded(Access.SUPERUSER)
    def internal(self) -> str:
        return "done"


def test_guarded_methods_check_the_token_and_hide_principal() -> None:
    signature = inspect.signature(_Target.append)
    assert "auth" in signature.parameters and "caller" not in signature.parameters
    open_target = _Target(AuthConfig(), {})
    assert asyncio.run(open_target.append(1)) == (1, None)  # auth off: anything goes
    target = _Target(AuthConfig(secret=SECRET), {"alice": ["produce"]})
    assert asyncio.run(target.append(2, auth=create_token(SECRET, "alice"))) == (2, "alice")
    with pytest.raises(NotAuthorized):
        asyncio.run(target.append(3, auth=create_token(SECRET, "bob")))
    with pytest.raises(AuthenticationFailed):
        asyncio.run(target.append(4))
    with pytest.raises(NotAuthorized):
        asyncio.run(target.internal(auth=create_token(SECRET, "alice")))
    assert asyncio.run(target.internal(auth=target.authorizer.engine_token())) == "done"
    assert target.fetches == 2  # superusers never need the topic's permissions


def test_catalog_grants_replace_revoke_and_version() -> None:
    catalog = Catalog().with_topic("orders", 2, 0).with_topic_state("orders", EntryState.ACTIVE)
    with pytest.raises(TopicNotFound):
        catalog.with_grant("nope", "alice", ["produce"])
    with pytest.raises(InvalidArgument):
        catalog.with_grant("orders", "alice", ["delete"])
    with pytest.raises(InvalidArgument):
        catalog.with_grant("orders", "alice", [])
    granted = catalog.with_grant("orders", "alice", ["produce", "consume"]).with_grant("orders", "alice", ["consume"])
    assert granted.topic_permissions("orders") == {"alice": ["consume"]}
    assert granted.permissions_version == catalog.permissions_version + 2
    revoked = granted.without_grant("orders", "alice")
    assert revoked.topic_permissions("orders") == {} and revoked.permissions_version > granted.permissions_version
    assert decode_catalog(encode_catalog(granted)) == granted
    gone = granted.with_topic_state("orders", EntryState.DELETING).without_topic("orders")
    assert gone.permissions == {}
    # a topic created again under the name starts without grants
    again = gone.with_topic("orders", 1, 5).with_topic_state("orders", EntryState.ACTIVE)
    assert again.topic_permissions("orders") == {}


def test_catalog_from_before_permissions_still_decodes() -> None:
    import msgspec

    old = msgspec.msgpack.encode({"topics": {}, "subscriptions": {}})
    assert decode_catalog(old).permissions == {}


def test_transactional_id_owner_is_the_first_registrant_and_survives_compaction() -> None:
    state = CoordinatorState(0)
    for now, principal in ((1, "alice"), (2, "bob")):
        for record in state.prepare_register_transactional_id("tid", now, principal):
            state.apply(record)
    assert state.transactional_id_principal("tid") == "alice"
    assert state.transactional_ids()["tid"] == 1
    replayed = CoordinatorState(0)
    for record in state.compacted_records():
        replayed.apply(record)
    assert replayed.transactional_id_principal("tid") == "alice"
    assert CoordinatorState(0).transactional_id_principal("tid") is None
