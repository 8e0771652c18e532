"""api/e2b/conversation.py: the code interpreter's execution counts, per sandbox, bounded
(least recently counted dropped first) so conversations ended by other ways than a kill
or a detach cannot make the map grow for good."""

from __future__ import annotations

from sandbox_workspace.api.e2b import conversation
from sandbox_workspace.api.e2b.conversation import EXECUTIONS, count_execution


def test_counts_are_per_sandbox_and_the_map_is_bounded(monkeypatch):
    monkeypatch.setattr(conversation, "MAX_COUNTED", 3)
    monkeypatch.setattr(conversation, "EXECUTIONS", type(EXECUTIONS)())
    keys = [("acme", "alice", f"c{i}") for i in range(4)]
    assert [count_execution(keys[0]) for _ in range(3)] == [1, 2, 3]
    for key in keys[1:3]:
        assert count_execution(key) == 1
    assert count_execution(keys[0]) == 4  # counted last: kept at the bound
    assert count_execution(keys[3]) == 1  # the fourth drops the least recently counted
    assert list(conversation.EXECUTIONS) == [keys[2], keys[0], keys[3]]
