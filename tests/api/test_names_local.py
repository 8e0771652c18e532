"""The local backend's session directories, over real HTTP on loopback: a directory whose
record names another session is never shared or overwritten, and one made under the
legacy 32-bit name (before 2026-11-28) keeps its files through the upgrade — while the
user whose id collided with it under that name gets a directory of their own."""

from __future__ import annotations

import json

import httpx
import pytest

from sandbox_workspace.operator import naming

pytestmark = pytest.mark.local_backend

# security-2026-11-28 H1: these two shared one directory under the 32-bit hash.
VICTIM, ATTACKER = "PRobEuSeR._...___", "probeuSEr.__....."


def client(server, user: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60)


def session_url(user: str) -> str:
    return f"/api/v1/sessions/{naming.session_id_for(user)}"


def upload(api: httpx.Client, user: str, name: str, data: bytes) -> None:
    r = api.post(
        f"{session_url(user)}/files/upload",
        files={"file": (name, data)},
        data={"conversation_id": "c1", "subdir": "temparea"},
    )
    assert r.status_code == 201, r.text


def names(api: httpx.Client, user: str) -> list[str]:
    r = api.get(f"{session_url(user)}/files", headers={"conversation_id": "c1"})
    assert r.status_code == 200, r.text
    return r.json()["files"]  # the names (seed 000 §6.3)


def dev(start_server, data):
    return start_server("dev", "--data-dir", str(data), SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")


def test_a_legacy_directory_keeps_its_files_and_is_never_the_colliders(start_server, tmp_path):
    data = tmp_path / "data"
    server = dev(start_server, data)
    with client(server, VICTIM) as victim:
        upload(victim, VICTIM, "secret.txt", b"the victim's")
    server.stop()
    # As an install from before the upgrade had it: the directory under the legacy name.
    sid = naming.session_id_for(VICTIM)
    sessions = data / "sessions"
    legacy = sessions / naming.dns_name(sid, legacy=True)
    (sessions / naming.dns_name(sid)).rename(legacy)
    assert legacy.name == naming.dns_name(naming.session_id_for(ATTACKER), legacy=True)

    server = dev(start_server, data)
    with client(server, VICTIM) as victim, client(server, ATTACKER) as attacker:
        assert names(victim, VICTIM) == ["secret.txt"]  # kept through the upgrade
        assert names(attacker, ATTACKER) == []  # a directory of their own
        upload(attacker, ATTACKER, "mine.txt", b"the attacker's")
        assert names(victim, VICTIM) == ["secret.txt"]
        record = json.loads((legacy / "session.json").read_text())
        assert record["session_id"] == sid  # never overwritten
        assert (sessions / naming.dns_name(naming.session_id_for(ATTACKER))).is_dir()


def test_a_directory_recording_another_session_is_refused(start_server, tmp_path):
    data = tmp_path / "data"
    taken = data / "sessions" / naming.dns_name(naming.session_id_for(ATTACKER))
    (taken / "workspace").mkdir(parents=True)
    other = {"session_id": "sb-session-mallory", "user_id": "mallory"}
    (taken / "session.json").write_text(json.dumps(other))  # unreadable as a record: kept
    server = dev(start_server, data)
    with client(server, ATTACKER) as attacker:
        r = attacker.get(f"{session_url(ATTACKER)}/files", headers={"conversation_id": "c1"})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "name_taken"
    assert json.loads((taken / "session.json").read_text()) == other
