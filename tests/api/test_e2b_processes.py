"""E2B's background commands and stdin through the official Python SDK (issue 39 item 1).

One SDK program against the session's dev server: a background loop is listed, its output
followed with ``commands.connect``, stdin reaches ``cat``, ``kill`` ends it; hostile
background processes (a fork bomb, a memory hog, a daemon that closed its fds and left its
session) are contained, and every process of the sandbox is gone once it is killed.
"""

from __future__ import annotations

import os
import sys
import time

from e2b_program import e2b_env, run_program

from tests.api.test_e2b_sdk import KEY

PROGRAM = r"""
import asyncio, json, time
from e2b import Sandbox

def until(handle, text):
    seen = ""
    for out, err, _ in handle:
        seen += out or err or ""
        if text in seen:
            return seen
    return seen

report = {}
sbx = Sandbox.create()
fg = sbx.commands.run("echo hi")
report["fg"] = [fg.exit_code, fg.stdout]
loop = sbx.commands.run("i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done",
                        background=True, timeout=0)
report["listed"] = loop.pid in [p.pid for p in sbx.commands.list()]
follower = sbx.commands.connect(loop.pid)
report["followed"] = "tick 3" in until(follower, "tick 3")
follower.disconnect()
report["killed"] = sbx.commands.kill(loop.pid)
deadline = time.time() + 10
while loop.pid in [p.pid for p in sbx.commands.list()] and time.time() < deadline:
    time.sleep(0.1)
report["gone"] = loop.pid not in [p.pid for p in sbx.commands.list()]
report["kill_again"] = sbx.commands.kill(loop.pid)

cat = sbx.commands.run("cat", background=True, stdin=True, timeout=0)
sbx.commands.send_stdin(cat.pid, "ping over stdin\n")
report["stdin"] = "ping over stdin" in until(cat, "ping over stdin")
sbx.commands.kill(cat.pid)

# Hostile background work: contained by the same limits as any execution.
bomb = sbx.commands.run("f() { f | f & }; f; sleep 30", background=True, timeout=0)
time.sleep(1)
report["bomb_killed"] = sbx.commands.kill(bomb.pid)
deadline = time.time() + 20
while True:  # the bomb's tree is going: commands start again
    try:
        report["fg_after"] = sbx.commands.run("echo still fine").stdout
        break
    except Exception:
        assert time.time() < deadline, "the fork bomb outlived its kill"
        time.sleep(0.2)
hog = sbx.commands.run(
    "python3 -c 'b = bytearray(64 << 30)' 2>/dev/null; echo hog=$?", background=True)
report["hog"] = hog.wait().stdout
sbx.commands.run(
    "setsid sh -c 'echo $$ > daemon.pid; exec </dev/null >/dev/null 2>&1; sleep 1000' &"
    " sleep 0.5; cat daemon.pid", background=True, timeout=0).wait()
report["daemon"] = int(sbx.files.read("daemon.pid").strip())

sbx.files.make_dir("watched")
watch = sbx.files.watch_dir("watched")
sbx.commands.run("echo one > watched/a.txt; echo two > watched/b.txt; sleep 0.05; rm watched/b.txt")
seen = [(e.name, e.type.name) for e in watch.get_new_events()]
sbx.commands.run("echo more >> watched/a.txt")
seen += [(e.name, e.type.name) for e in watch.get_new_events()]
sbx.commands.run("mv watched/a.txt watched/c.txt")
seen += [(e.name, e.type.name) for e in watch.get_new_events()]
watch.stop()
report["watch"] = seen

async def watch_async():
    from e2b import AsyncSandbox
    asbx = await AsyncSandbox.connect(sbx.sandbox_id)
    got = asyncio.Event()
    events = []
    def on_event(e):
        events.append((e.name, e.type.name))
        got.set()
    handle = await asbx.files.watch_dir("watched", on_event)
    await asbx.commands.run("echo x > watched/async.txt")
    await asyncio.wait_for(got.wait(), 20)
    await handle.stop()
    return events

report["watch_async"] = asyncio.run(watch_async())
report["sandbox_killed"] = sbx.kill()
print(json.dumps(report))
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_background_commands_stdin_kill_and_hostile_ones_end_with_the_sandbox(dev_server, tmp_path):
    report = run_program([sys.executable, "-c", PROGRAM], e2b_env(dev_server.url, KEY), tmp_path)
    assert report["fg"] == [0, "hi\n"]
    assert report["listed"] and report["followed"]
    assert report["killed"] is True and report["gone"]
    assert report["kill_again"] is False  # an ended process is not found
    assert report["stdin"]
    assert report["bomb_killed"] is True and report["fg_after"] == "still fine\n"
    assert report["hog"] == "hog=1\n"  # MemoryError: RLIMIT_AS holds background code too
    assert report["sandbox_killed"] is True
    # Polled: b.txt made and removed between two looks is not seen; a rename is a
    # REMOVE and a CREATE.
    assert report["watch"] == [
        ["a.txt", "CREATE"], ["a.txt", "WRITE"], ["c.txt", "CREATE"], ["a.txt", "REMOVE"]
    ]  # fmt: skip
    assert report["watch_async"] == [["async.txt", "CREATE"]]
    daemon = report["daemon"]
    deadline = time.monotonic() + 15
    while _alive(daemon):
        assert time.monotonic() < deadline, "the daemon outlived its sandbox"
        time.sleep(0.1)
    assert os.getpid() != daemon
