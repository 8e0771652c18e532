"""The operator's key scenarios on a kind cluster (tier 4): the operator and the API run
in the cluster from one image, sandbox pods are real containers.

Skipped, with the probe's reason, where pytest-kind or a Docker daemon is missing.
"""

from __future__ import annotations

import pytest
from kindenv.scenarios import (
    Deployment,
    conversation_delete_removes_files,
    session_delete_collects_everything,
    start_session,
    upload_is_visible,
)

pytestmark = pytest.mark.kind


def test_session_runs_in_a_locked_down_pod(kind_deployment: Deployment, user: str):
    start_session(kind_deployment, user)


def test_upload_through_the_api_is_in_the_workspace(kind_deployment: Deployment, user: str):
    start_session(kind_deployment, user)
    upload_is_visible(kind_deployment, user)


def test_conversation_delete_removes_its_files(kind_deployment: Deployment, user: str):
    session = start_session(kind_deployment, user)
    upload_is_visible(kind_deployment, user)
    conversation_delete_removes_files(kind_deployment, user, session["workspace_path"])


def test_session_delete_collects_its_children(kind_deployment: Deployment, user: str):
    start_session(kind_deployment, user)
    upload_is_visible(kind_deployment, user)
    session_delete_collects_everything(kind_deployment, user)
