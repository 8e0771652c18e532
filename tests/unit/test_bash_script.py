"""``runtime/bash_script.bash_command``: a script by argument up to ``ARGV_CODE_BYTES``,
past it from a sealed memfd handed as the fd after the call's own, closed afterwards."""

from __future__ import annotations

import fcntl
import os
import subprocess

import pytest

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
