"""The test fixture's SeaweedFS start survives losing a port between picking it and binding it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from raytxn.tools import seaweedfs


def test_a_port_taken_before_weed_binds_it_starts_a_fresh_server(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real_free_port = seaweedfs._free_port
    calls = []

    def free_port() -> int:  # the first server's S3 port (the 7th picked) is one already bound
        calls.append(1)
        return taken.getsockname()[1] if len(calls) == 7 else real_free_port()

    monkeypatch.setattr(seaweedfs, "_free_port", free_port)
    server = seaweedfs.start_seaweedfs(tmp_path)
    try:
        assert server.s3_port != taken.getsockname()[1]
        assert (tmp_path / "weed.log").read_bytes().count(b"address already in use") >= 1  # the first one lost it
        assert server.data_dir == tmp_path / "retry-1"
        server.create_bucket("after-a-lost-port")
    finally:
        server.stop()
        taken.close()
