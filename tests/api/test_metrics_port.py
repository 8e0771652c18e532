"""``/metrics`` on a port of its own (``SANDBOX_WORKSPACE_METRICS_PORT``, issue 41 item 6):
served there, counting the API port's requests, and no longer on the API's port; it
ends with the API (SIGTERM reaches the API's server, not the metrics listener)."""

from __future__ import annotations

import signal

import httpx
import pytest
from ports import free_port

pytestmark = pytest.mark.local_backend


def test_metrics_move_to_their_own_port_and_end_with_the_api(start_server):
    port = free_port()
    server = start_server("dev", SANDBOX_WORKSPACE_METRICS_PORT=str(port))
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 404
    httpx.get(server.url + "/healthz", timeout=10)
    r = httpx.get(metrics_url, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'sandbox_api_requests_total{method="GET",route="/healthz",status="200"}' in r.text
    assert httpx.get(f"http://127.0.0.1:{port}/api/v1/sessions", timeout=10).status_code == 404
    # uvicorn shuts down gracefully, then re-raises the signal it captured: -15.
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM), server.log()[-2000:]
    with pytest.raises(httpx.ConnectError):
        httpx.get(metrics_url, timeout=5)


def test_without_a_metrics_port_metrics_stay_on_the_api_port(dev_server):
    r = httpx.get(dev_server.url + "/metrics", timeout=10)
    assert r.status_code == 200 and "sandbox_api_requests_total" in r.text
