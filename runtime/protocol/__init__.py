"""The pure protocol: state machines and formats. No Ray, asyncio, obstore, time or os here:
clocks come in as arguments (enforced by the import contracts in pyproject.toml)."""
