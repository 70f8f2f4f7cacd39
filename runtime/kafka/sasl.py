"""SASL messages of the Kafka gateway (pure: no Ray, no asyncio, no I/O, no clock).

The gateway authenticates a connection with a raytxn token (a JWT ``raytxn token`` issues) in
one of two SASL mechanisms, both one message from the client and an empty answer on success:

* ``PLAIN`` (RFC 4616): ``authzid NUL username NUL password``; the password is the token and the
  username must be the principal the token names (``sub``), so a client configured with another
  user's name and a token of its own is refused rather than silently acting as the token's
  principal. An authzid, if any, must be that same principal (no acting for someone else).
* ``OAUTHBEARER`` (RFC 7628, KIP-255): the client's first message ``n,,\\x01auth=Bearer
  <token>\\x01\\x01`` (a GS2 header, then key=value pairs separated by ``\\x01``); the bearer
  token is the raytxn token. Extensions (other keys) are ignored, as Kafka's default validator
  does.

Verifying a token's signature is the engine's job (the gateway holds no secret); this module only
takes the messages apart and reads a token's claims (``token_claims``) once the engine has said it
is genuine, to learn when its session ends.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"
MECHANISMS = (PLAIN, OAUTHBEARER)
MAX_SASL_BYTES = 64 << 10  # a token is a few hundred bytes; anything past this is not a login


class SaslError(ValueError):
    """A SASL message that is not one of the mechanism's (its text goes to the client)."""


@dataclass(frozen=True)
class Credentials:
    """What a client presented: the token, and the principal it claims to be (PLAIN's username;
    None for OAUTHBEARER, where only the token names it)."""

    token: str
    username: str | None = None


def parse(mechanism: str, data: bytes) -> Credentials:
    """The credentials in a client's SASL message for ``mechanism``; ``SaslError`` if malformed."""
    if len(data) > MAX_SASL_BYTES:
        raise SaslError(f"SASL message of {len(data)} bytes (limit {MAX_SASL_BYTES})")
    if mechanism == PLAIN:
        return parse_plain(data)
    if mechanism == OAUTHBEARER:
        return parse_oauthbearer(data)
    raise SaslError(f"SASL mechanism {mechanism!r} is not served (only {', '.join(MECHANISMS)})")


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError(f"{what} is not UTF-8") from None


def parse_plain(data: bytes) -> Credentials:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``."""
    parts = _text(data, "the SASL/PLAIN message").split("\x00")
    if len(parts) != 3:
        raise SaslError("SASL/PLAIN message must be authzid NUL username NUL password")
    authzid, username, password = parts
    if not username or not password:
        raise SaslError("SASL/PLAIN needs a username (the raytxn principal) and a password (its raytxn token)")
    if authzid and authzid != username:
        raise SaslError(f"SASL/PLAIN authorization id {authzid!r} differs from the username {username!r}")
    return Credentials(password, username)


def parse_oauthbearer(data: bytes) -> Credentials:
    """RFC 7628's initial client response: ``gs2-header \\x01 *(key=value \\x01) \\x01``."""
    text = _text(data, "the SASL/OAUTHBEARER message")
    if text == "\x01":  # the client's answer to an error challenge: it gives up
        raise SaslError("SASL/OAUTHBEARER: the client ended the exchange")
    header, sep, rest = text.partition("\x01")
    if not sep or not rest.endswith("\x01\x01"):
        raise SaslError("SASL/OAUTHBEARER message must be 'n,,\\x01auth=Bearer <token>\\x01\\x01'")
    if not (header.startswith("n,") or header.startswith("y,")) or header.count(",") != 2:
        raise SaslError(f"SASL/OAUTHBEARER GS2 header {header!r} is not 'n,,' (channel binding is not served)")
    pairs = {}
    for item in rest[:-2].split("\x01"):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SaslError("SASL/OAUTHBEARER message has a malformed key=value pair")
        pairs[key] = value
    scheme, _, token = pairs.get("auth", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise SaslError("SASL/OAUTHBEARER message has no 'auth=Bearer <token>'")
    return Credentials(token.strip())


def token_claims(token: str) -> dict[str, Any]:
    """A JWT's payload, read without checking the signature: call it only for a token the engine
    verified (``whoami`` answered with its principal). ``SaslError`` if it is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        raise SaslError("the token is not a JWT")
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, json.JSONDecodeError):
        raise SaslError("the token's payload is not JSON") from None
    if not isinstance(claims, dict):
        raise SaslError("the token's payload is not a JSON object")
    return claims


def token_expiry_s(token: str) -> int | None:
    """The ``exp`` claim (epoch seconds) of a verified token, None when it never expires."""
    exp = token_claims(token).get("exp")
    return exp if isinstance(exp, int) and not isinstance(exp, bool) else None
