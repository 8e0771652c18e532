# syntax=docker/dockerfile:1
# One image for the three processes of Sandbox Workspace; the entrypoint is the CLI:
#   sandbox-workspace operator | api | runtime   (see docs/operations.md)
# Non-root (uid/gid 10001), made to run with a read-only root filesystem: only /tmp and,
# in sandbox pods, /workspace need to be writable.
#
# BASE_IMAGE: any Debian-based image with Python 3.11+ at `python3` (with venv/ensurepip).
# scripts/build-image.sh builds one locally with debootstrap where no registry is reachable.
ARG BASE_IMAGE=python:3.11-slim

# ---- deps: a virtualenv with the dependencies and the sandbox's Python libraries --------
# Built from pyproject.toml alone, so this stage (the slow, large part) is reused from
# the build cache until the dependencies change.
FROM ${BASE_IMAGE} AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
COPY pyproject.toml /src/pyproject.toml
# The project's own code lives in /opt/app (next stage): a .pth file puts it on the path
# of every interpreter of the venv, even the runtime's kernels started with a clean
# environment. The installers go at the end: not needed at run time.
RUN python3 -m venv /opt/venv \
 && python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
print("\n".join([*p["dependencies"], *p["optional-dependencies"]["sandbox"]]))' \
      > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt \
 && echo /opt/app > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sandbox-workspace.pth" \
 && /opt/venv/bin/python -m pip uninstall -y -q pip setuptools wheel

# ---- shim: the preload library that gives executed code private POSIX shared memory ---
# (runtime/shm.py: multiprocessing pools, shared_memory, joblib). Built with the base's C
# compiler, installed here when missing; should that fail, /out stays empty and the image
# works without it (parallel code then fails as it would without the library).
FROM ${BASE_IMAGE} AS shim
COPY runtime/shm_shim.c /src/shm_shim.c
RUN mkdir /out \
 && { command -v cc >/dev/null \
      || { apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev; } \
      || true; } \
 && { cc -O2 -shared -fPIC -o /out/sbw_shm.so /src/shm_shim.c \
      || echo "WARNING: no C compiler: the image has no shared-memory shim"; }

# ---- final: the base, the virtualenv, the code, an unprivileged user --------------------
FROM ${BASE_IMAGE}
# The runtime runs code with bash and confines it with setpriv (util-linux; a package of
# its own in newer Debian releases). Debian bases have both; install them where missing.
RUN if ! command -v bash >/dev/null || ! command -v setpriv >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends bash util-linux \
      && { command -v setpriv >/dev/null || apt-get install -y --no-install-recommends setpriv; } \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && command -v bash && command -v setpriv \
 && groupadd --gid 10001 sandbox \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin sandbox \
 && mkdir -p /workspace && chown 10001:10001 /workspace
COPY --from=deps /opt/venv /opt/venv
# The package laid out as setuptools' package-dir installs it (pure Python, no data files).
COPY sandbox_workspace /opt/app/sandbox_workspace
COPY api /opt/app/sandbox_workspace/api
COPY operator /opt/app/sandbox_workspace/operator
COPY runtime /opt/app/sandbox_workspace/runtime
COPY --from=shim /out/ /opt/app/sandbox_workspace/runtime/
RUN /opt/venv/bin/python -m compileall -q /opt/app \
 && printf '%s\n' '#!/opt/venv/bin/python' 'import sys' 'from sandbox_workspace.cli import main' \
      'sys.exit(main())' > /usr/local/bin/sandbox-workspace \
 && chmod 0755 /usr/local/bin/sandbox-workspace
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
WORKDIR /tmp
# 8000: the API; 8080: the runtime in a sandbox pod (the operator: 8081 health, 9090 metrics).
EXPOSE 8000 8080
ENTRYPOINT ["sandbox-workspace"]
CMD ["--help"]
