"""How a bash script reaches bash: its argument, or past ``ARGV_CODE_BYTES`` a file.

Contract of ``bash_command(code, fds)`` (a context manager): the argv and the fds to spawn
so that bash runs ``code``. A script up to ``ARGV_CODE_BYTES`` is ``bash --noprofile
--norc -c CODE``, as always. A larger one could not go so: one argument of ``execve``
holds at most 128 KiB (``MAX_ARG_STRLEN``) and the spawn message at most what a socket
buffer takes (~208 KB unprivileged) — 140 KB of code failed "Argument list too long",
250 KB "Message too long", both under the 256 KiB an execution may have. It is written to
a sealed memfd handed to the code as the fd after ``fds``, which a short ``-c`` reader
takes whole (``read -d ''`` from a seekable file: no path opened, so Landlock has nothing
to refuse) and ``eval``s: the script then runs in the same shell, with the same
environment, working directory, exit status and ``exit`` (tests/unit/test_bash_script.py
pins what a script may lean on: ``$0``, ``$LINENO``, ``set -e``, traps, ``return`` at top
level, ``shopt``, aliases, stdin…). What differs, all harmless: bash's error prefix
("bash: eval: line N" for "bash: -c: line N"; a syntax error on the first line quotes
the reader's ``unset __sbw_script;`` before it), ``$BASH_EXECUTION_STRING`` and
``/proc/self/cmdline`` (the reader), ``set -x``'s depth ("++ "), ``$_`` before the first
command, and the last command runs as bash's child where ``-c`` would exec into it (as
with any script whose last command is not simple). The memfd is closed on leaving
(the spawner holds its own copy by then). A script holding NUL, or a lone surrogate no
argument could carry, goes by argument and fails to start there as it always did (read
would stop at the NUL and run a prefix).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

ARGV_CODE_BYTES = 96 * 1024
_BASH = ["bash", "--noprofile", "--norc", "-c"]
# The name is unset before the script runs: the script sees no variable of ours.
_READER = 'IFS= read -r -d "" -u {fd} __sbw_script; exec {fd}<&-; eval "unset __sbw_script; $__sbw_script"'  # noqa: E501
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


@contextlib.contextmanager
def bash_command(code: str, fds: list[int]) -> Iterator[tuple[list[str], list[int]]]:
    try:  # as execve would encode the argument (os.fsencode)
        data = code.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate: by argument, failing as it always did
        data = b""
    if len(data) <= ARGV_CODE_BYTES or b"\0" in data:
        yield [*_BASH, code], fds
        return
    script = os.memfd_create("sbw-script", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(script, view) :]
        os.lseek(script, 0, os.SEEK_SET)
        fcntl.fcntl(script, fcntl.F_ADD_SEALS, _SEALS)
        yield [*_BASH, _READER.format(fd=len(fds))], [*fds, script]
    finally:
        os.close(script)
