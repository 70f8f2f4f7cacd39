"""raytxn runtime: ids, errors, ledgers, state machines and the client API."""
