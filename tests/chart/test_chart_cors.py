"""The chart's CORS and web-page values reach the API as settings it parses (and bad origins are
refused by the values schema)."""

from __future__ import annotations

from typing import Any

import pytest
from charttools import Tools, render, render_text

from sandbox_workspace.api.settings import ApiSettings


def api_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    [api] = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-api")
    ]
    container = api["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_cors_origins_become_the_api_setting(tools: Tools, monkeypatch: pytest.MonkeyPatch):
    assert "SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS" not in api_env(render(tools))
    docs = render(
        tools,
        set_values={
            "api.cors.allowOrigins[0]": "https://app.example.com",
            "api.cors.allowOrigins[1]": "http://localhost:3000",
        },
    )
    value = api_env(docs)["SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS"]
    monkeypatch.setenv("SANDBOX_WORKSPACE_CORS_ALLOW_ORIGINS", value)
    settings = ApiSettings(auth_mode="dev")
    assert settings.cors_allow_origins == ["https://app.example.com", "http://localhost:3000"]


def test_values_schema_refuses_an_origin_with_a_path(tools: Tools):
    result = render_text(
        tools, set_values={"api.cors.allowOrigins[0]": "https://app.example.com/x"}, check=False
    )
    assert result.returncode != 0 and "allowOrigins" in result.stderr


@pytest.mark.parametrize(("value", "served"), [(None, False), ("true", True)])
def test_web_ui_value_becomes_the_api_setting(
    tools: Tools, monkeypatch: pytest.MonkeyPatch, value: str | None, served: bool
):
    """Off by default in a cluster; `api.webUI=true` turns the /ui/ page on."""
    docs = render(tools, set_values={"api.webUI": value} if value else None)
    setting = api_env(docs)["SANDBOX_WORKSPACE_WEB_UI"]
    monkeypatch.setenv("SANDBOX_WORKSPACE_WEB_UI", setting)
    # dev mode would turn the page on by default: the chart's explicit value must win.
    assert ApiSettings(auth_mode="dev").web_ui is served
