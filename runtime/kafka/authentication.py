"""SaslHandshake and SaslAuthenticate: a connection logs in with a raytxn token (``sasl``).

The gateway holds no secret: it asks the engine who a token names by calling the supervisor's
``whoami`` *with that token*, which verifies its signature and expiry as every engine actor does.
Only then does it read the token's ``exp`` claim, to end the session there: SaslAuthenticate v1+
tells the client its ``session_lifetime_ms`` (KIP-368), so librdkafka and kafka-python log in
again on the same connection before it ends; a connection still on an expired token is closed
at its next request (what Kafka does to a client that did not re-authenticate).

A re-authentication must name the same principal (Kafka's rule: a connection does not change
whom it acts for). SaslHandshake v0 is followed by the SASL message in a raw frame (no request
header), answered by an empty raw frame on success; v1 by a SaslAuthenticate request.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raytxn.errors import AuthenticationFailed, RaytxnError
from raytxn.kafka import sasl, wire
from raytxn.kafka.security import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    Session,
)
from raytxn.kafka.wire import LoginFailed

log = logging.getLogger(__name__)

# ``whoami(token)``: the supervisor's answer for that token ({"principal", "superuser", ...});
# ``AuthenticationFailed`` when it is not genuine or has expired.
WhoAmI = Callable[[str], Awaitable[dict[str, Any]]]
# ``refused(reason)``: count a refusal.
Refused = Callable[[str], None]


class Authenticator:
    def __init__(self, whoami: WhoAmI, refused: Refused, clock: Callable[[], float] = time.time) -> None:
        self._whoami, self._refused, self._clock = whoami, refused, clock

    def handshake(self, header: wire.RequestHeader, request: Any, session: Session) -> bytes:
        mechanism = request.mechanism
        if not session.auth_on:
            # Nothing to log in to: a client configured for SASL is told no mechanism is enabled,
            # which is true, rather than being let through as if its credentials meant something.
            self._refused("unsupported_sasl_mechanism")
            return wire.encode_response(header, error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=[])
        if mechanism not in sasl.MECHANISMS:
            self._refused("unsupported_sasl_mechanism")
            return wire.encode_response(header, error_code=UNSUPPORTED_SASL_MECHANISM,
                                        mechanisms=list(sasl.MECHANISMS))
        session.mechanism = mechanism
        session.raw_sasl = header.api_version == 0
        return wire.encode_response(header, error_code=wire.NONE, mechanisms=list(sasl.MECHANISMS))

    async def authenticate(self, header: wire.RequestHeader, request: Any, session: Session) -> bytes:
        """SaslAuthenticate: the session logs in, or the answer is SASL_AUTHENTICATION_FAILED
        with the reason (the session is unchanged: a re-authentication that fails leaves the
        connection on its old token, which still ends at its expiry)."""
        if session.mechanism is None or session.raw_sasl:
            self._refused("illegal_sasl_state")
            return wire.encode_response(header, error_code=ILLEGAL_SASL_STATE,
                                        error_message="SaslAuthenticate without a SaslHandshake v1 before it",
                                        auth_bytes=b"", session_lifetime_ms=0)
        error = await self._login(session, bytes(request.auth_bytes))
        if error is not None:
            return wire.encode_response(header, error_code=SASL_AUTHENTICATION_FAILED, error_message=error,
                                        auth_bytes=b"", session_lifetime_ms=0)
        return wire.encode_response(header, error_code=wire.NONE, error_message=None, auth_bytes=b"",
                                    session_lifetime_ms=session.lifetime_ms(self._clock()))

    async def raw(self, payload: bytes, session: Session) -> bytes:
        """The raw SASL frame after a v0 handshake: an empty frame on success, else
        ``LoginFailed`` (the connection is then closed, as Kafka does)."""
        session.raw_sasl = False
        error = await self._login(session, payload)
        if error is not None:
            raise LoginFailed(error)
        return struct.pack(">i", 0)

    async def _login(self, session: Session, message: bytes) -> str | None:
        """None once ``session`` is logged in with the message's credentials, else why not."""
        mechanism, session.mechanism = session.mechanism, None
        assert mechanism is not None
        try:
            credentials = sasl.parse(mechanism, message)
            answer = await self._whoami(credentials.token)
            principal = answer["principal"]
            if credentials.username is not None and credentials.username != principal:
                raise sasl.SaslError(f"the username {credentials.username!r} is not the token's principal "
                                     f"{principal!r}")
            if session.principal is not None and principal != session.principal:
                raise sasl.SaslError(f"re-authentication as {principal!r} on a connection of {session.principal!r}")
            expires = sasl.token_expiry_s(credentials.token)
        except (sasl.SaslError, AuthenticationFailed) as e:
            self._refused("sasl_authentication_failed")
            log.info("Kafka SASL/%s login refused: %s", mechanism, e)
            return f"SASL/{mechanism} authentication failed: {e}"
        except RaytxnError as e:  # the engine did not answer: the client may try again
            self._refused("sasl_authentication_failed")
            log.warning("Kafka SASL/%s login could not be checked: %r", mechanism, e)
            return f"SASL/{mechanism}: the engine could not verify the token now ({type(e).__name__}); retry"
        session.principal, session.token, session.superuser = principal, credentials.token, bool(answer["superuser"])
        session.expires_at_s = expires
        return None
