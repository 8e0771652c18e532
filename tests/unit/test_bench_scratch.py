"""What a benchmark run in the node's private namespaces leaves behind: nothing it named
(bench/harness.py ``namespaced_scratch``), and never a directory that is not its own or
has something mounted in it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "bench" / "harness.py"


def _load_harness():
    """bench/harness.py by its path: the repository's root is not importable from the
    tests (its ``operator/`` would shadow the standard library's)."""
    spec = importlib.util.spec_from_file_location("bench_harness", HARNESS)
    module = sys.modules["bench_harness"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registered first: its dataclasses look it up
    return module


harness = _load_harness()
WORKDIRS_ENV, namespaced_scratch, removable = (
    harness.WORKDIRS_ENV,
    harness.namespaced_scratch,
    harness.removable,
)


def test_the_work_directories_a_namespaced_run_names_are_removed_after_it(tmp_path) -> None:
    kept = tmp_path / "not-a-bench-dir"
    kept.mkdir()
    with namespaced_scratch("sbw-bench-test-") as (top, env):
        # The inner run is another process: it makes and names its directory itself.
        made = subprocess.run(
            [sys.executable, "-c", INNER, str(HARNESS), str(kept)],
            cwd=tmp_path,
            env={**env, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert Path(made, "node", "data").is_file()
        assert top.is_dir()
    assert not Path(made).exists()
    assert not top.exists()
    assert kept.is_dir(), "a directory that is not a bench one is never removed"


INNER = """
import importlib.util, sys, tempfile
from pathlib import Path
spec = importlib.util.spec_from_file_location("bench_harness", sys.argv[1])
harness = sys.modules["bench_harness"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)
work = Path(tempfile.mkdtemp(prefix="sbw-bench-inner-"))
(work / "node").mkdir()
(work / "node" / "data").write_text("x")
harness.note_workdir(work)
harness.note_workdir(Path(sys.argv[2]))
print(work)
"""


def test_only_a_bench_directory_with_nothing_mounted_in_it_is_removable() -> None:
    tmp = Path(tempfile.gettempdir())
    bench = tmp / "sbw-bench-e2b-node-abc"
    assert removable(bench, ["/", "/proc", str(tmp)])
    assert not removable(bench, ["/", str(bench / "node" / "rootfs")])
    assert not removable(bench, [str(bench)])
    assert removable(bench, [str(tmp / "sbw-bench-e2b-node-abcd")])  # a neighbour
    assert not removable(tmp / "work", [])
    assert not removable(tmp / "x" / "sbw-bench-deeper", [])
    assert not removable(Path("/work/main/sbw-bench-x"), [])


def test_a_run_outside_a_namespaced_scratch_names_nothing(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(WORKDIRS_ENV, raising=False)
    harness.note_workdir(tmp_path)  # no listing: nothing written anywhere, no error
    assert list(tmp_path.iterdir()) == []
