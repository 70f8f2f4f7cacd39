"""A TCP proxy between clients and a server (the tests put it between obstore and SeaweedFS's S3
port) that can, on command, pass traffic through, slow it down, answer every request with
``503 Service Unavailable``, or reset every connection. Real sockets, real bytes: the S3 client
meets what a struggling object store sends it.

It runs on its own event loop in a daemon thread of the test process; the engine's actors (other
processes) connect to ``endpoint``. Switching to ``error`` or ``reset`` closes every connection
open through it, so pooled keep-alive connections meet the new mode too.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from typing import Literal

Mode = Literal["pass", "slow", "error", "reset"]
CHUNK = 64 << 10
MAX_REQUEST_HEAD = 64 << 10  # an error answer reads at most this much of the request first
REQUEST_HEAD_WAIT_S = 5.0
_ERROR_BODY = (b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
               b"<Resource>/</Resource></Error>")
SERVICE_UNAVAILABLE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_ERROR_BODY), _ERROR_BODY))


class FlakyProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode: Mode = "pass"
        self.delay_s = 0.0
        self.connections = 0  # accepted so far
        self.refused = 0      # answered with 503 or reset
        self._open: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True, name="flaky-proxy")
        self._thread.start()
        assert started.wait(10), "the proxy did not start"
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_mode(self, mode: Mode, delay_s: float = 0.0) -> None:
        """``slow``: every chunk from the server waits ``delay_s`` first; ``error``: every request
        gets a 503; ``reset``: every connection is reset at once."""
        assert mode in ("pass", "slow", "error", "reset"), mode
        self.mode, self.delay_s = mode, delay_s
        if mode in ("error", "reset"):
            asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            await self._close_all()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # --- the loop's side ---------------------------------------------------------------------

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        started.set()
        self._loop.run_forever()

    async def _close_all(self) -> None:
        for writer in list(self._open):
            _reset(writer)
        self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode == "reset":
            self.refused += 1
            _reset(writer)
            return
        if self.mode == "error":
            self.refused += 1
            await _answer_unavailable(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(self._pump(reader, up_writer, slow=False), self._pump(up_reader, writer, slow=True))
        finally:
            for end in (writer, up_writer):
                self._open.discard(end)
                end.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, slow: bool) -> None:
        try:
            while data := await source.read(CHUNK):
                if slow and self.mode == "slow":
                    await asyncio.sleep(self.delay_s)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not sink.is_closing():
                sink.close()


async def _answer_unavailable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the request's head (so the client sees an answer, not a reset), answer 503, close."""
    head = b""
    try:
        while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_HEAD:
            chunk = await asyncio.wait_for(reader.read(CHUNK), REQUEST_HEAD_WAIT_S)
            if not chunk:
                break
            head += chunk
        writer.write(SERVICE_UNAVAILABLE)
        await writer.drain()
    except (ConnectionError, OSError, TimeoutError):
        pass
    finally:
        writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a crashing or overloaded server's kernel would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.close()
