"""Parallel Python in confined code: process pools, concurrent.futures and shared memory
work, with their semaphores and segments in the conversation's own scratch space (the
preload library of runtime/shm.py), never in /dev/shm (which Landlock denies)."""

from __future__ import annotations

import pytest
from api_calls import execute as run

pytestmark = pytest.mark.local_backend


def test_multiprocessing_pool_with_a_function_defined_in_a_cell(api, session_url):
    code = (
        "import multiprocessing\n"
        "def square(x):\n    return x * x\n"
        "with multiprocessing.Pool(2) as pool:\n    print(pool.map(square, range(6)))"
    )
    result = run(api, session_url, code, timeout=120)
    assert result["error"] is None, result
    assert result["stdout"] == "[0, 1, 4, 9, 16, 25]\n"


def test_process_pool_executor(api, session_url):
    code = (
        "from concurrent.futures import ProcessPoolExecutor\n"
        "def cube(x):\n    return x ** 3\n"
        "with ProcessPoolExecutor(max_workers=2) as ex:\n    print(list(ex.map(cube, range(4))))"
    )
    result = run(api, session_url, code, timeout=120)
    assert result["error"] is None, result
    assert result["stdout"] == "[0, 1, 8, 27]\n"


def test_shared_memory_and_locks_between_processes(api, session_url):
    code = """
import multiprocessing as mp, os
from multiprocessing import shared_memory
import numpy as np

def fill(name, lock, start):
    shm = shared_memory.SharedMemory(name=name)
    data = np.ndarray((4,), dtype=np.int64, buffer=shm.buf)
    with lock:
        data[start:start + 2] = [start + 1, start + 2]
    del data
    shm.close()

shm = shared_memory.SharedMemory(create=True, size=32)
lock = mp.Lock()
workers = [mp.Process(target=fill, args=(shm.name, lock, i)) for i in (0, 2)]
for w in workers: w.start()
for w in workers: w.join()
print(np.ndarray((4,), dtype=np.int64, buffer=shm.buf).tolist())
where = os.path.join(os.environ["TMPDIR"], "shm", shm.name.lstrip("/"))
print(os.path.exists(where), os.path.exists("/dev/shm" + shm.name))
shm.close(); shm.unlink()
print(os.path.exists(where))
"""
    result = run(api, session_url, code, timeout=120)
    assert result["error"] is None, result
    # In the conversation's scratch space, not /dev/shm; gone once unlinked.
    assert result["stdout"] == "[1, 2, 3, 4]\nTrue False\nFalse\n"


def test_a_queue_and_a_semaphore_across_processes(api, session_url):
    code = """
import multiprocessing as mp
def work(q, sem):
    with sem:
        q.put("hello from a child")
q, sem = mp.Queue(), mp.BoundedSemaphore(1)
p = mp.Process(target=work, args=(q, sem)); p.start()
print(q.get(timeout=30)); p.join()
"""
    result = run(api, session_url, code, timeout=120)
    assert result["stdout"] == "hello from a child\n", result


def test_joblib_with_every_core(api, session_url):
    pytest.importorskip("joblib")
    code = (
        "from joblib import Parallel, delayed\n"
        "def double(x):\n    return 2 * x\n"
        "print(Parallel(n_jobs=-1)(delayed(double)(i) for i in range(6)))"
    )
    result = run(api, session_url, code, timeout=180)
    assert result["error"] is None, result
    assert result["stdout"] == "[0, 2, 4, 6, 8, 10]\n", result


def test_without_the_preload_library_dev_shm_stays_denied(api, session_url):
    # What the library fixes: glibc's own sem_open goes to /dev/shm, which Landlock denies.
    code = "env -u LD_PRELOAD python3 -c 'import multiprocessing; multiprocessing.Lock()'"
    result = run(api, session_url, code, language="bash")
    assert result["exit_code"] == 1 and "PermissionError" in result["stderr"], result
