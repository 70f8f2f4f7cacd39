"""Durable append-only ledgers on object storage (see ``managed.py`` for the design)."""

from raytxn.ledger.managed import Entry, LedgerConfig, ManagedLedger, chunk_path, ledger_prefix
from raytxn.ledger.metadata import LedgerInfo, StreamMetadata, read_metadata

__all__ = ["Entry", "LedgerConfig", "LedgerInfo", "ManagedLedger", "StreamMetadata", "chunk_path",
           "ledger_prefix", "read_metadata"]
