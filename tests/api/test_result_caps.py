"""Executed code cannot make the runtime or the API hold its `result` lines: it writes
them straight into the kernel's event pipe (as the security review's H3 probe does), and
the execution's results stay capped in count and bytes, flagged `truncated`, while the
API's and the runtime's peak RSS stay flat and /healthz answers."""

from __future__ import annotations

import uuid

import httpx
import pytest
from rss_watch import PeakWatch
from sse_stream import Stream

pytestmark = pytest.mark.local_backend

FORGE = """
import os, fcntl, json
evt = next(fd for fd in range(3, 64)
           if os.path.exists(f"/proc/self/fd/{fd}")
           and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
           and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY)
line = (json.dumps({"type": "result", "data": {"text/plain": "x" * SIZE}}) + "\\n").encode()
for _ in range(COUNT):
    os.write(evt, line)
"""


def forge(size: int, count: int) -> str:
    return FORGE.replace("SIZE", str(size)).replace("COUNT", str(count))


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")


@pytest.fixture
def session(server, runtime_pids):
    user = f"u-{uuid.uuid4().hex[:10]}"
    url = f"/api/v1/sessions/sb-session-{user}"
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=120) as api:
        assert api.post("/api/v1/sessions", json={}).status_code == 201
        api.get(f"{url}/files", params={"conversation_id": "c"})  # wait until running
        peak = PeakWatch(server.proc.pid, *runtime_pids(server.workdir))
        yield api, url
        peak.check()
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
        api.delete(url)


def execute(api: httpx.Client, url: str, code: str) -> tuple[dict, int]:
    r = api.post(
        f"{url}/execute", json={"conversation_id": "c", "language": "python", "code": code}
    )
    assert r.status_code == 200, r.text
    return r.json(), len(r.content)


def test_result_lines_far_past_the_cap_are_dropped_unread(session):
    """Eight 32 MiB result lines: each is longer than any result kept, so the runtime
    skips it in pieces; the answer is small and says it was cut."""
    api, url = session
    result, size = execute(api, url, forge(32 << 20, 8))
    assert result["error"] is None, result
    assert result["results"] == [] and result["truncated"] is True
    assert size < 64 * 1024
    after, _ = execute(api, url, "1 + 1")  # the interpreter carries on
    assert after["results"] == [{"data": {"text/plain": "2"}}]


def test_results_are_capped_in_bytes(session):
    api, url = session
    result, size = execute(api, url, forge(1 << 20, 20))
    assert result["truncated"] is True
    assert len(result["results"]) == 7  # 8 MiB of results, each a little over 1 MiB
    assert size < 9 << 20


def test_results_are_capped_in_count(session):
    api, url = session
    result, _ = execute(api, url, forge(10, 5000))
    assert result["truncated"] is True
    assert len(result["results"]) == 100


def test_a_streamed_execution_is_capped_the_same_way(session):
    api, url = session
    body = {
        "conversation_id": "c",
        "language": "python",
        "code": forge(32 << 20, 4) + forge(10, 500),
        "stream": True,
    }
    with api.stream("POST", f"{url}/execute", json=body) as r:
        assert r.status_code == 200
        events = list(Stream(r))
    results = [data for _, kind, data in events if kind == "result"]
    [done] = [data for _, kind, data in events if kind == "done"]
    assert len(results) == 100 and done["truncated"] is True
