"""The operator and the API as real subprocesses that a test can kill and start again.

``Stack(kubeconfig, namespace, workdir)``: ``start_operator()`` / ``stop_operator(kill=)``
and ``start_api()`` / ``stop_api()``; ``api_url`` once the API answers; ``running(kube_api)``
both for a test's whole life, the namespace's sandbox resources deleted before the
operator goes (their finalizers need it). Each start
appends to its own log in ``workdir`` (``operator.log``, ``api.log``), so one file
tells a whole story across restarts. Settings are the deployment's environment
variables, tuned for tests: short retry delays, a fast periodic check.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from .client import KubeClient, delete_sandbox_resources, wait_until
from .processes import clean_env, cli_command


class Stack:
    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        workdir: Path,
        *,
        operator_env: dict[str, str] | None = None,
        api_env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig, self.namespace, self.workdir = str(kubeconfig), namespace, workdir
        self.operator_env = operator_env or {}
        self.api_env = api_env or {}
        self.operator: subprocess.Popen | None = None
        self.api: subprocess.Popen | None = None
        self.api_url = ""

    def _spawn(self, argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        with open(self.workdir / log, "ab") as out:
            return subprocess.Popen(
                [*cli_command(), *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,  # not the repository: its operator/ shadows the stdlib
                start_new_session=True,
            )

    def start_operator(self) -> None:
        assert self.operator is None or self.operator.poll() is not None
        defaults = dict(
            SANDBOX_OPERATOR_KUBECONFIG=self.kubeconfig,
            SANDBOX_OPERATOR_NAMESPACES=self.namespace,
            SANDBOX_OPERATOR_IMAGE="sandbox-workspace:test",
            SANDBOX_OPERATOR_CHECK_INTERVAL_SECONDS="0.5",
            SANDBOX_OPERATOR_RETRY_MAX_DELAY_SECONDS="1",
            SANDBOX_OPERATOR_STANDALONE="true",
            SANDBOX_OPERATOR_LIVENESS_ENDPOINT="",
            SANDBOX_OPERATOR_METRICS_PORT="",
            SANDBOX_OPERATOR_LOG_FORMAT="text",
        )
        env = clean_env(**{**defaults, **self.operator_env})  # operator_env may override
        self.operator = self._spawn(["operator"], env, "operator.log")

    def stop_operator(self, kill: bool = False) -> None:
        """SIGTERM and wait (a clean shutdown), or SIGKILL (a crash)."""
        _stop(self.operator, signal.SIGKILL if kill else signal.SIGTERM)
        self.operator = None

    def start_api(self, timeout: float = 60) -> str:
        port_file = self.workdir / "api.port"
        port_file.unlink(missing_ok=True)
        env = clean_env(
            SANDBOX_WORKSPACE_BACKEND="kubernetes",
            SANDBOX_WORKSPACE_AUTH_MODE="dev",
            SANDBOX_WORKSPACE_KUBECONFIG=self.kubeconfig,
            SANDBOX_WORKSPACE_NAMESPACE=self.namespace,
            SANDBOX_WORKSPACE_LOG_FORMAT="text",
            SANDBOX_WORKSPACE_SESSION_IDLE_TIMEOUT_SECONDS="3600",
            **self.api_env,
        )
        self.api = self._spawn(
            ["api", "--port", "0", "--port-file", str(port_file)], env, "api.log"
        )
        api = self.api

        def answering() -> bool:
            assert api.poll() is None, (self.workdir / "api.log").read_text()[-3000:]
            if not port_file.exists() or not port_file.read_text().strip():
                return False
            self.api_url = f"http://127.0.0.1:{int(port_file.read_text())}"
            try:
                return httpx.get(self.api_url + "/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answering, timeout=timeout, interval=0.05, message="the API to answer")
        return self.api_url

    def stop_api(self, kill: bool = False) -> None:
        """SIGTERM and wait (a clean shutdown), or SIGKILL (a crash)."""
        _stop(self.api, signal.SIGKILL if kill else signal.SIGTERM)
        self.api = None

    def stop(self) -> None:
        self.stop_api()
        self.stop_operator()

    @contextmanager
    def running(self, kube_api: KubeClient) -> Iterator[str]:
        """The operator and the API up (yields the API's URL); afterwards the API stops,
        the sessions and workspaces left are deleted while the operator still runs (their
        finalizers need it), then the operator stops."""
        self.start_operator()
        try:
            yield self.start_api()
        finally:
            self.stop_api()
            delete_sandbox_resources(kube_api, self.namespace)
            self.stop_operator()


def _stop(proc: subprocess.Popen | None, sig: int, grace: float = 30.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    deadline = time.monotonic() + grace
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
