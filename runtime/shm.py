"""The preload library that gives code private POSIX shared memory (``shm_shim.c``).

Why a C shim (LD_PRELOAD) rather than Python: glibc's ``shm_open``/``sem_open`` are what
CPython's ``_posixshmem`` and ``_multiprocessing`` call, and what numpy/joblib/any C
extension calls; only interposing those four functions (and ``sem_close``) at the C
level covers every caller — a sitecustomize patch would miss C extensions and
``multiprocessing``'s own C module. The objects go to a directory inside the
conversation's scratch space: Landlock already confines that to the conversation, and
it is deleted with it.

Contract: ``library()`` → the path of the built library, building it once with the C
compiler (``cc``/``gcc`` on PATH) next to its source when it is missing or older than
the source (the image ships it prebuilt: ``Dockerfile``); None when there is neither a
library nor a compiler (parallel code then fails as without the shim: /dev/shm is
denied). ``environment(scratch)`` → the variables a code process needs, or {}.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("shm_shim.c")
LIBRARY = Path(__file__).with_name("sbw_shm.so")
SHM_SUBDIR = "shm"


def library(source: Path = SOURCE, target: Path = LIBRARY) -> str | None:
    built = str(target) if target.exists() else None
    if built and (not source.exists() or target.stat().st_mtime >= source.stat().st_mtime):
        return built
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not source.exists():
        if built is None:
            log.warning(
                "no shared-memory shim (%s) and no C compiler to build it: multiprocessing "
                "pools and shared_memory will fail in executed code",
                target,
            )
        return built  # an image's prebuilt library, even if its mtime looks older
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".sbw_shm-", suffix=".so")
        os.close(fd)
    except OSError as e:  # a read-only package directory
        if built is None:
            log.warning("cannot build the shared-memory shim in %s: %s", target.parent, e)
        return built
    try:
        subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic: runtimes building at once all get a whole file
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        log.warning("building the shared-memory shim failed: %s %s", e, detail.decode()[-500:])
        Path(tmp).unlink(missing_ok=True)
        return built
    return str(target)


def environment(shim: str | None, scratch: str) -> dict[str, str]:
    if shim is None:
        return {}
    return {"LD_PRELOAD": shim, "SBW_SHM_DIR": os.path.join(scratch, SHM_SUBDIR)}
