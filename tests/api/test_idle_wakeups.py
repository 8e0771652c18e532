"""An idle API and an idle runtime make no periodic wakeup, and still do what their ticks
did: uvicorn's 0.1 s tick (``sandbox_workspace.server.QuietServer``: exit when told, a
current Date header) and the runtime's 0.25 s session-memory watch (it waits for a call).

Wakeups are counted, never CPU time, so a loaded machine cannot fail the test: the
voluntary context switches of the processes' threads (each sleep that ends is one), from
/proc of this test's own processes only. Before the change an idle API made 10 a
second and an idle runtime 14; the bound below is a few per window, for the odd one-off
timer (a keep-alive connection's end)."""

from __future__ import annotations

import os
import signal
import threading
import time
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from api_calls import execute
from polling import wait_for
from starlette.applications import Starlette

from sandbox_workspace import server as server_module
from sandbox_workspace.runtime.limits import descendants
from sandbox_workspace.server import QuietServer, bind

pytestmark = pytest.mark.local_backend

WINDOW = 2.0  # seconds counted
MOST = 4  # wakeups allowed in the window (was 20 for the API, 28 for the runtime)
WITH_INTERPRETER = 40  # an idle interpreter alive: ~28 in the window (was ~76)


def _wakeups(pids: list[int]) -> int:
    """Voluntary context switches of every thread of ``pids`` so far."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def _idle_wakeups(api_pid: int) -> tuple[int, int]:
    """(the API's, its runtimes') wakeups in ``WINDOW`` seconds of nobody calling."""
    time.sleep(0.5)  # the last request's aftermath (thread hand-offs) settles
    runtimes = descendants(api_pid)
    assert runtimes, "no runtime process under the API"
    before = _wakeups([api_pid]), _wakeups(runtimes)
    time.sleep(WINDOW)
    return _wakeups([api_pid]) - before[0], _wakeups(runtimes) - before[1]


@pytest.fixture(scope="module")
def idle_api(start_server):
    # The local backend's default session memory ceiling: the runtime's watch is on.
    return start_server("dev", "--data-dir", "data")


@pytest.fixture(scope="module")
def session(idle_api, wait_status):
    with httpx.Client(base_url=idle_api.url, headers={"X-User-Id": "idle"}, timeout=60) as c:
        assert c.post("/api/v1/sessions", json={}).status_code == 201
        url = "/api/v1/sessions/sb-session-idle"
        wait_status(c, url, "running")
        yield c, url


def test_an_idle_api_and_runtime_make_no_periodic_wakeup(idle_api, session):
    api, runtime = _idle_wakeups(idle_api.proc.pid)
    assert api <= MOST and runtime <= MOST, (api, runtime)


def test_the_runtime_is_quiet_again_once_its_code_is_gone(idle_api, session):
    """A call alive is watched (its memory counts); once none is, the watch sleeps again.
    While its interpreter waits, the reaper's 0.1 s limit tick and the 0.25 s session
    watch remain (on the loop: no thread hand-off): 14 a second, 38 before."""
    client, url = session
    quiet = set(descendants(idle_api.proc.pid))  # the runtime (and its spawner) alone
    assert execute(client, url, "1 + 1", cid="q")["results"] == [{"data": {"text/plain": "2"}}]
    api, runtime = _idle_wakeups(idle_api.proc.pid)
    assert api <= MOST and runtime <= WITH_INTERPRETER, (api, runtime)
    r = client.delete(f"{url}/conversations/q")  # its interpreter goes with it
    assert r.status_code in (200, 202), r.text
    # A 202 ends the interpreter after the answer: count once its processes are gone.
    wait_for(lambda: set(descendants(idle_api.proc.pid)) <= quiet, "the interpreter to end")
    api, runtime = _idle_wakeups(idle_api.proc.pid)
    assert api <= MOST and runtime <= MOST, (api, runtime)


def test_the_date_header_is_current_with_no_tick(idle_api):
    first = httpx.get(idle_api.url + "/healthz").headers["date"]
    time.sleep(1.1)  # a new second: uvicorn's tick would have refreshed it by now
    second = httpx.get(idle_api.url + "/healthz").headers["date"]
    assert first != second
    age = time.time() - parsedate_to_datetime(second).timestamp()
    assert -2 < age < 5, age


def test_a_server_with_no_tick_still_exits_at_once_on_a_signal(start_server, tmp_path):
    runtime = start_server(
        "runtime",
        "--host",
        "127.0.0.1",
        SANDBOX_RUNTIME_TOKEN="t",
        SANDBOX_RUNTIME_ROOT=str(tmp_path),
    )
    started = time.monotonic()
    runtime.proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down, then raises the signal it caught again: ended by it, gracefully.
    assert runtime.proc.wait(timeout=20) == -signal.SIGTERM
    # The signal wakes the loop itself; nothing waits for a tick (or never ends for want of one).
    assert time.monotonic() - started < 10
    assert "Finished server process" in runtime.log()


def test_a_server_with_no_tick_exits_when_another_thread_says_so(monkeypatch):
    """How the tests' own servers (scripted LLM, table source) and the metrics listener
    are stopped: ``should_exit`` set from outside the server's loop wakes it. Their Date
    header is current too: ``QuietServer`` itself makes requests refresh it (none of
    them asks for it)."""
    config = uvicorn.Config(Starlette(), log_level="warning", lifespan="off")
    server = QuietServer(config)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the server to start")
    # A day later for the request's refresh alone (uvicorn's own clock is not moved): with
    # no tick, only a request can have moved the Date set when the server started.
    later = time.time() + 86400
    monkeypatch.setattr(server_module, "time", SimpleNamespace(time=lambda: later))
    port = sock.getsockname()[1]
    date = httpx.get(f"http://127.0.0.1:{port}/").headers["date"]
    assert parsedate_to_datetime(date).timestamp() == int(later), date
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
    assert not thread.is_alive()
