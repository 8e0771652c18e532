"""``runtime/bash_script.bash_command``: a script by argument up to ``ARGV_CODE_BYTES``,
past it from a sealed memfd handed as the fd after the call's own, closed afterwards."""

from __future__ import annotations

import fcntl
import os
import subprocess

import pytest

from sandbox_workspace.runtime import bash_script
from sandbox_workspace.runtime.bash_script import ARGV_CODE_BYTES, bash_command


def test_a_script_up_to_the_bound_goes_as_the_argument():
    code = "echo " + "x" * (ARGV_CODE_BYTES - 5)
    with bash_command(code, [0, 1, 2]) as (argv, fds):
        assert argv == ["bash", "--noprofile", "--norc", "-c", code] and fds == [0, 1, 2]


@pytest.mark.parametrize("odd", ["\0", "\ud800"])
def test_a_script_no_argument_could_carry_goes_as_one_and_fails_there(odd):
    code = "echo " + "x" * ARGV_CODE_BYTES + odd
    with bash_command(code, [0, 1, 2]) as (argv, fds):
        assert argv[-1] == code and fds == [0, 1, 2]


def test_a_larger_script_is_read_whole_from_a_sealed_file_after_the_calls_fds():
    code = "printf '%s' \"$0\"; echo; " + "#" * (ARGV_CODE_BYTES + 10) + "\necho end"
    with bash_command(code, [0, 1, 2, 7]) as (argv, fds):
        script = fds[-1]
        assert fds[:4] == [0, 1, 2, 7] and len(fds) == 5
        assert "-u 4" in argv[-1] and len(argv[-1]) < 200
        assert fcntl.fcntl(script, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
        with pytest.raises(PermissionError):
            os.write(script, b"x")
        # The reader as the code process runs it: the script at fd 4.
        run = subprocess.run(
            argv, pass_fds=[4], preexec_fn=lambda: os.dup2(script, 4), capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert (run.stdout, run.returncode) == ("bash\nend\n", 0), run
    with pytest.raises(OSError):
        os.fstat(script)  # closed on leaving


def _run(code: str, large: bool, monkeypatch) -> tuple[int, str, str]:
    """``code`` as the code process runs it: stdin a pipe holding "in", the script (when
    ``large``) at fd 3."""
    monkeypatch.setattr(bash_script, "ARGV_CODE_BYTES", 0 if large else 1 << 30)
    r, w = os.pipe()
    os.write(w, b"in\nmore\n")
    os.close(w)
    try:
        with bash_command(code, [r, 1, 2]) as (argv, fds):
            assert (len(fds) == 4) is large

            def place() -> None:
                moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
                for target, fd in enumerate(moved):
                    os.dup2(fd, target)
                os.closerange(len(moved), 1024)  # then exec: subprocess closes nothing more

            run = subprocess.run(
                argv, preexec_fn=place, close_fds=False, capture_output=True, text=True,
                check=False, env={"PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8"},
            )  # fmt: skip
    finally:
        os.close(r)
    return run.returncode, run.stdout, run.stderr


# What a script may lean on behaves the same by argument and from the memfd.
SAME = {
    "exit": "echo a; exit 3; echo b",
    "last status": "false",
    "$0": 'echo "$0"',
    "LINENO": "echo $LINENO\n\necho $LINENO\nf(){ echo $LINENO; }\nf",
    "set -e": "set -e\nf(){ false; echo in; }\nf || echo caught\nf\necho after",
    "trap EXIT": "trap 'echo bye $?' EXIT\nexit 4",
    "exit in a function": "f(){ exit 5; }\nf\necho no",
    "return at top level": "return 7\necho after $?",
    "shopt": "shopt -s extglob\n[[ ab == +(a|b) ]] && echo matched",
    "aliases": "shopt -s expand_aliases\nalias hi='echo hello'\nhi there",
    "BASH_ARGV": "shopt -s extdebug\necho ${#BASH_ARGV[@]} ${BASH_ARGC[@]} ${FUNCNAME[@]}",
    "positional": 'echo $# "$@"; shift; echo $?',
    "stdin": "read x; echo got $x; cat",
    # Listed by bash's own glob: a pipeline (`ls | sort`) raced bash's pipe fds.
    "no fd of ours": 'for f in /proc/$$/fd/*; do printf "%s " "${f##*/}"; done',
    "no variable of ours": "declare -p __sbw_script 2>/dev/null; echo ${#__sbw_script}",
    "bytes": "printf %s $'\\x01\\x7f' '\x01\x7f\udcff\x01' 'é✓' | od -An -tx1",
    "here doc unterminated": "cat <<EOF\nhello $((1+1))\n",
    "backslash at the end": "echo a \\",
    "signal": "kill -TERM $$",
    "break and local at top": "break; local x=1; echo $?",
    "set -u": "set -u\necho $nope\necho after",
}


@pytest.mark.parametrize("name", SAME)
def test_a_script_behaves_the_same_by_argument_and_from_the_file(name, monkeypatch):
    code = SAME[name]
    assert _run(code, True, monkeypatch) == _run(code, False, monkeypatch)


# Where they differ, by design: bash's error prefix (and a syntax error on the first
# line quotes the reader's `unset` before it), `$BASH_EXECUTION_STRING` (the reader),
# `set -x`'s depth ('++'), and the last command is bash's child, not bash exec'd into.
def test_a_syntax_error_says_eval_and_where(monkeypatch):
    code = "echo a\nfi\necho b"
    status, out, err = _run(code, True, monkeypatch)
    assert (status, out) == (2, "a\n") and err.startswith("bash: eval: line 2: syntax error")
    assert _run(code, False, monkeypatch)[2] == err.replace("eval", "-c")
