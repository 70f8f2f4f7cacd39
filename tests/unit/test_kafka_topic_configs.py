"""The Kafka gateway's topic configs (``raytxn.kafka.topic_admin``, pure): what CreateTopics'
configs become as raytxn's topic settings, what is refused, and how a topic's settings read back
under Kafka's names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.kafka.topic_admin import (
    COMPACTION_THRESHOLD,
    STORAGE_COVERED,
    ConfigError,
    TopicSettings,
    parse_topic_configs,
    topic_configs,
)


def test_honoured_configs_become_topic_settings() -> None:
    assert parse_topic_configs([]) == TopicSettings()
    assert parse_topic_configs([("cleanup.policy", "compact"), ("retention.ms", "60000"),
                                ("retention.bytes", "-1"), (COMPACTION_THRESHOLD, "4096")]) == TopicSettings(
        compacted=True, retention_bytes=None, retention_s=60.0, compaction_threshold_bytes=4096)
    assert parse_topic_configs([("cleanup.policy", " delete "), ("retention.bytes", "1000"),
                                ("retention.ms", "-1")]) == TopicSettings(retention_bytes=1000)
    assert parse_topic_configs([("min.insync.replicas", "2"), ("segment.bytes", "1"),
                                ("message.timestamp.type", "CreateTime"),
                                ("compression.type", "producer")]) == TopicSettings()


@pytest.mark.parametrize(("configs", "named"), [
    ([("cleanup.policy", "compact,delete")], "cleanup.policy"),
    ([("cleanup.policy", "shred")], "cleanup.policy"),
    ([("min.compaction.lag.ms", "10")], "min.compaction.lag.ms"),
    ([("max.message.bytes", "10")], "max.message.bytes"),
    ([("no.such.config", "1")], "no.such.config"),
    ([("retention.ms", "soon")], "retention.ms"),
    ([("retention.bytes", "-2")], "retention.bytes"),
    ([("retention.ms", None)], "retention.ms"),
    ([("retention.ms", "1"), ("retention.ms", "2")], "twice"),
    ([("message.timestamp.type", "LogAppendTime")], "message.timestamp.type"),
    ([("compression.type", "zstd")], "compression.type"),
    ([(COMPACTION_THRESHOLD, "100")], "compacted topic"),
    ([("cleanup.policy", "compact"), (COMPACTION_THRESHOLD, "0")], "positive"),
])
def test_configs_raytxn_would_not_honour_are_refused_by_name(configs: list, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        parse_topic_configs(configs)


@given(st.booleans(), st.none() | st.integers(0, 1 << 40), st.none() | st.integers(0, 1 << 40),
       st.integers(1, 1 << 40))
def test_settings_read_back_as_the_configs_that_made_them(compacted: bool, retention_bytes: int | None,
                                                          retention_ms: int | None, threshold: int) -> None:
    """Kafka's names round-trip: the configs a topic's row describes create the same settings
    (a compacted topic's row always holds its threshold, the default one included)."""
    row = {"compacted": compacted, "retention_bytes": retention_bytes,
           "retention_s": None if retention_ms is None else retention_ms / 1000,
           "compaction_threshold_bytes": threshold if compacted else None}
    described = topic_configs(row)
    again = parse_topic_configs([(name, value) for name, value, _, _ in described])
    assert again.compacted == compacted and again.retention_bytes == retention_bytes
    assert again.retention_s == row["retention_s"]
    assert again.compaction_threshold_bytes == (threshold if compacted else None)
    defaults = {name for name, _, default, _ in described if default}
    assert ("cleanup.policy" in defaults) == (not compacted)
    assert ("retention.bytes" in defaults) == (retention_bytes is None)


def test_storage_covered_configs_are_kafka_topic_configs_with_no_raytxn_meaning() -> None:
    assert "min.insync.replicas" in STORAGE_COVERED and "segment.bytes" in STORAGE_COVERED
    assert not {"cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes"} & STORAGE_COVERED
