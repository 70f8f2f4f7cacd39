"""The profile tool's reading of py-spy's raw output (raytxn.tools.profile_peers)."""

from __future__ import annotations

from pathlib import Path

from raytxn.tools.profile_peers import function_table, markdown, total_share


def test_function_table_gives_self_and_total_shares_of_the_busy_samples(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join([
        "Thread.run (threading.py:982);serve (kafka/gateway.py:281);decode (kafka/records.py:97) 6",
        "Thread.run (threading.py:982);serve (kafka/gateway.py:283);write (asyncio/selector_events.py:10) 2",
        # recursion: a function counted once per sample in its total share
        "Thread.run (threading.py:982);serve (kafka/gateway.py:281);serve (kafka/gateway.py:290) 2",
        "Thread.run (threading.py:982);BaseEventLoop.run_forever (asyncio/base_events.py:607);"
        "EpollSelector.select (selectors.py:468) 5",  # waiting: not busy
        "Worker.main_loop (_private/worker.py:900) 5",  # Ray's core worker loop: not busy
        "garbage line without a count",
    ]))
    every, busy, rows = function_table(str(raw))
    assert (every, busy) == (20, 10)
    by_name = {r["function"]: r for r in rows}
    assert by_name["decode (kafka/records.py)"] == {"function": "decode (kafka/records.py)", "self_pct": 60.0,
                                                    "total_pct": 60.0}
    assert by_name["serve (kafka/gateway.py)"]["self_pct"] == 20.0
    assert by_name["serve (kafka/gateway.py)"]["total_pct"] == 100.0
    assert rows[0]["function"] == "decode (kafka/records.py)"  # ordered by self share
    assert total_share(str(raw), ("records.py",)) == 30.0  # of every sample, waiting ones included
    summary = {"case": "produce", "msgs_per_s": 1, "cpu_s": {"KafkaGateway": 0.5}, "attach_errors": {},
               "profiles": {"KafkaGateway": {"cpu_s": 0.5, "samples": every, "busy_samples": busy, "top": rows}}}
    text = markdown([summary], min_busy=5)
    assert "### produce" in text and "| 60.0 | 60.0 | `decode (kafka/records.py)` |" in text
    assert markdown([summary], min_busy=11).count("self %") == 0  # too few busy samples for a table
