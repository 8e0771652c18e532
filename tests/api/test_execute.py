"""Code execution through the API: state, timeouts, caps, streaming, rich output, isolation."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import httpx
import pytest
from api_calls import execute as run


def sse_events(lines) -> list[tuple[str, dict]]:
    events, kind = [], None
    for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((kind, json.loads(line[len("data: ") :])))
    return events


def test_python_state_persists_between_calls(api, session_url):
    first = run(api, session_url, "import math\nanswer = 41")
    # The first call has no earlier state to lose.
    assert first["exit_code"] == 0 and first["kernel_restarted"] is False
    second = run(api, session_url, "print(math.sqrt(16))\nanswer + 1")
    assert second["stdout"] == "4.0\n"
    assert second["results"] == [{"data": {"text/plain": "42"}}]
    assert second["kernel_restarted"] is False


def test_exception_and_exit_code_are_data(api, session_url):
    py = run(api, session_url, "print('before')\n{}['missing']")
    assert py["exit_code"] == 1 and py["stdout"] == "before\n"
    assert py["error"]["name"] == "KeyError" and "'missing'" in py["error"]["value"]
    assert "<cell>" in py["error"]["traceback"]
    sh = run(api, session_url, "echo out; echo err >&2; exit 7", language="bash")
    assert (sh["exit_code"], sh["stdout"], sh["stderr"], sh["error"]) == (7, "out\n", "err\n", None)


def test_timeout_kills_and_next_call_gets_a_fresh_interpreter(api, session_url):
    run(api, session_url, "state = 'kept'")
    slow = run(api, session_url, "import time\nwhile True: time.sleep(0.05)", timeout=1)
    assert slow["error"]["name"] == "TimeoutError" and slow["exit_code"] == 1
    # The answer whose message says the state is lost says so in kernel_restarted too;
    # the next call is told nothing new.
    assert slow["kernel_restarted"] is True and "restarted" in slow["error"]["value"]
    after = run(api, session_url, "print('alive'); 'state' in globals()")
    assert after["stdout"] == "alive\n" and after["kernel_restarted"] is False
    assert after["results"][0]["data"]["text/plain"] == "False"
    sh = run(api, session_url, "sleep 30", language="bash", timeout=1)
    assert sh["exit_code"] == 124 and sh["error"]["name"] == "TimeoutError"


def test_output_is_capped_and_flagged(api, session_url):
    flood = run(api, session_url, "print('x' * 3_000_000)")
    assert flood["truncated"] is True
    assert 0 < len(flood["stdout"]) <= 1024 * 1024
    sh = run(api, session_url, "yes flood | head -c 50000000", language="bash")
    assert sh["truncated"] is True and sh["exit_code"] == 0
    assert run(api, session_url, "print('still fine')")["stdout"] == "still fine\n"


def test_streaming_delivers_output_before_the_end(api, session_url):
    gate = "gate.txt"
    code = (
        "import os, time\nprint('first', flush=True)\n"
        f"while not os.path.exists({gate!r}): time.sleep(0.01)\nprint('second')"
    )
    workdir = Path(
        run(api, session_url, "import os; os.getcwd()")["results"][0]["data"]["text/plain"].strip(
            "'"
        )
    )
    seen: list[tuple[str, dict]] = []
    with api.stream(
        "POST",
        f"{session_url}/execute",
        json={
            "conversation_id": "c",
            "language": "python",
            "code": code,
            "stream": True,
            "timeout": 60,
        },
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                seen.append((kind, json.loads(line[6:])))
                if kind == "stdout" and "first" in seen[-1][1]["text"]:
                    # Only now may the code finish: "first" arrived while it was running.
                    (workdir / gate).touch()
    kinds = [k for k, _ in seen]
    assert kinds[0] == "stdout" and kinds[-1] == "done"
    assert seen[-1][1]["stdout"] == "first\nsecond\n"
    assert "".join(d["text"] for k, d in seen if k == "stdout") == "first\nsecond\n"


def test_matplotlib_plot_comes_back_as_png(api, session_url):
    out = run(
        api,
        session_url,
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('demo')",
        timeout=120,
    )
    assert out["exit_code"] == 0, out
    images = [r["data"]["image/png"] for r in out["results"] if "image/png" in r["data"]]
    assert len(images) == 1
    assert base64.b64decode(images[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_dataframe_gets_an_html_table(api, session_url):
    out = run(api, session_url, "import pandas as pd\npd.DataFrame({'a': [1, 2]})", timeout=120)
    [result] = out["results"]
    assert "<table" in result["data"]["text/html"] and "a" in result["data"]["text/plain"]


def test_code_reads_the_upload_at_the_reported_path(api, session_url):
    r = api.post(
        f"{session_url}/files/upload",
        files={"file": ("sales.csv", b"m,v\na,1\nb,2\n")},
        data={"conversation_id": "c"},
    )
    path = r.json()["path"]
    out = run(
        api, session_url, f"import pandas as pd\nint(pd.read_csv({path!r})['v'].sum())", timeout=120
    )
    assert out["results"][0]["data"]["text/plain"] == "3"
    sh = run(api, session_url, f"wc -l < {path!r}", language="bash")
    assert sh["stdout"].strip() == "3"
    rel = run(api, session_url, "cat uploads/temparea/sales.csv | head -1", language="bash")
    assert rel["stdout"] == "m,v\n", "cwd is the conversation directory"


@pytest.mark.local_backend
def test_runtime_token_is_not_visible_to_code(api, session_url, runtime_pids):
    run(api, session_url, "1")
    session_dir = Path(api.get(session_url).json()["workspace_path"]).parent
    [pid] = runtime_pids(session_dir)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    token = next(e for e in environ if e.startswith(b"SANDBOX_RUNTIME_TOKEN=")).split(b"=", 1)[1]
    py = run(api, session_url, "import os\nprint(sorted(os.environ.items()))")
    sh = run(
        api, session_url, "env; cat /proc/$PPID/environ 2>&1 | tr '\\0' '\\n'", language="bash"
    )
    for out in (py, sh):
        assert token.decode() not in out["stdout"] + out["stderr"]
        assert "SANDBOX_RUNTIME" not in out["stdout"]


def test_twenty_concurrent_executions_stay_isolated(dev_server, user, session_url):
    async def main():
        async with httpx.AsyncClient(
            base_url=dev_server.url, headers={"X-User-Id": user}, timeout=120
        ) as client:

            async def one(i: int):
                cid = f"conv-{i}"
                await client.post(
                    f"{session_url}/execute",
                    json={
                        "conversation_id": cid,
                        "language": "python",
                        "code": f"mine = {i}\nopen('own-{i}.txt', 'w').write('{i}')",
                    },
                )
                r = await client.post(
                    f"{session_url}/execute",
                    json={
                        "conversation_id": cid,
                        "language": "python",
                        "code": "import os\n(mine, sorted(f for f in os.listdir('.') "
                        "if f.startswith('own')))",
                    },
                )
                return i, r.json()

            return await asyncio.gather(*(one(i) for i in range(20)))

    for i, out in asyncio.run(main()):
        assert out["exit_code"] == 0, out
        assert out["results"][0]["data"]["text/plain"] == f"({i}, ['own-{i}.txt'])"


def test_restart_endpoint_drops_state(api, session_url):
    run(api, session_url, "value = 1")
    r = api.post(f"{session_url}/conversations/c/kernel/restart")
    assert r.status_code == 200 and r.json()["restarted"] is True
    out = run(api, session_url, "'value' in globals()")
    assert out["results"][0]["data"]["text/plain"] == "False"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param({"language": "ruby", "code": "puts 1"}, 422, id="unknown-language"),
        pytest.param({"language": "python", "code": ""}, 422, id="empty-code"),
        pytest.param({"language": "python", "code": "   \n"}, 422, id="blank-code"),
        pytest.param(
            {"language": "python", "code": "x" * (256 * 1024 + 1)}, 422, id="oversized-code"
        ),
        pytest.param({"language": "python", "code": "1", "timeout": 0}, 422, id="timeout-zero"),
        pytest.param(
            {"language": "python", "code": "1", "timeout": 100000}, 422, id="timeout-too-long"
        ),
        pytest.param(
            {"language": "python", "code": "1", "conversation_id": "../x"},
            400,
            id="traversal-conversation",
        ),
        pytest.param(
            {"language": "python", "code": "1", "conversation_id": ".runtime"},
            400,
            id="reserved-conversation",
        ),
        pytest.param({"language": "python"}, 422, id="missing-code"),
    ],
)
def test_bad_execute_requests(api, session_url, body, status):
    r = api.post(f"{session_url}/execute", json={"conversation_id": "c", **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


def test_other_users_session_cannot_execute(api, dev_server, session_url, user):
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": f"{user}-x"}) as other:
        r = other.post(
            f"{session_url}/execute",
            json={"conversation_id": "c", "language": "bash", "code": "id"},
        )
    assert r.status_code == 404


def test_runaway_code_does_not_take_the_runtime_down(api, session_url):
    out = run(
        api, session_url, "sleep 1000 & sleep 1000 & echo started", language="bash", timeout=5
    )
    assert out["stdout"] == "started\n" and out["exit_code"] == 0
    ps = run(api, session_url, "ps -eo args | grep -c '^sleep 1000' || true", language="bash")
    assert ps["stdout"].strip() == "0", "background jobs of a finished call are killed"
    boom = run(api, session_url, "import os\nos._exit(3)")
    assert boom["error"]["name"] == "KernelDied"
    assert run(api, session_url, "print('back')")["stdout"] == "back\n"


FORK_LIMIT_AVAILABLE = os.geteuid() != 0 or os.access("/sys/fs/cgroup/pids", os.W_OK)


@pytest.mark.skipif(
    not FORK_LIMIT_AVAILABLE,
    reason="root without a writable pids cgroup: a fork bomb would hit the "
    "machine's pid table; the runtime has no limit to test here",
)
def test_fork_bomb_hits_the_process_ceiling_not_the_machine(api, session_url):
    bomb = run(api, session_url, "bomb() { bomb | bomb & }; bomb", language="bash", timeout=3)
    assert bomb["exit_code"] in (0, 124)
    assert run(api, session_url, "echo recovered", language="bash")["stdout"] == "recovered\n"
    assert run(api, session_url, "print('python too')")["stdout"] == "python too\n"


def test_files_named_as_stdlib_modules_do_not_break_the_interpreter(api, session_url):
    """``python -m kernel_main`` put the conversation's directory first on ``sys.path``
    before the kernel's own imports: a ``json.py`` or ``ast.py`` there (code's, or a
    user's file of that name) made every Python call "KernelDied: the interpreter exited
    while it was starting". The kernel starts with ``-P``; cells still import from the
    conversation's directory."""
    made = run(api, session_url, "printf 'raise SystemExit(3)\\n' > json.py; cp json.py ast.py; "
               "printf 'VALUE = 42\\n' > mine.py", language="bash")  # fmt: skip
    assert made["exit_code"] == 0, made
    result = run(api, session_url, "import mine; print(mine.VALUE)")
    assert (result["error"], result["stdout"]) == (None, "42\n"), result
