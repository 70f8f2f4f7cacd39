"""Operator and test tooling: the CLI, benchmarks, the chaos workload, the history and the
exactly-once checker, SeaweedFS for S3 tests."""
