"""No sandbox pod holds another conversation's keys (store mode ``s3``, issue 21 item 7),
on a real pod: code run in one user's sandbox tries everything the pod holds — its
environment, /proc, mounted secrets and service-account token paths, the runtime's state
and token, a TCP connection to the store (the node's loopback port, the node's
addresses, the pod's gateway), the other session's pod, a SigV4-signed S3 request with
whatever it found — and every attempt fails with a named refusal. The test then tries the
same things from the node, where the network does reach the store: what the pod holds
opens nothing there either. Another session's object, made through the API, is never
read.
"""

from __future__ import annotations

import base64
import errno
import inspect
import json
import os
import urllib.parse
import uuid

import httpx
import pytest
import sigv4
from nodeenv.network import NODE_IP, SECOND_NODE_IP, SERVICE_IP
from sessions import UserSession

pytestmark = pytest.mark.node

# Run in the attacker's sandbox after sigv4's source and a line CONFIG = {...}: every
# attempt as {"what", "ok", "step", "errno", "error"}, and everything it could read.
PROBE = r"""
import errno, json, os, socket, urllib.request

found = {"env": dict(os.environ), "files": {}, "attempts": []}

def attempt(what, step, fn):
    try:
        out = fn()
    except OSError as e:
        cause = getattr(e, "reason", None)  # urllib's URLError wraps the socket's error
        e = cause if isinstance(cause, OSError) else e
        found["attempts"].append({"what": what, "ok": False, "step": step,
                                  "errno": e.errno, "error": repr(e)})
        return None
    found["attempts"].append({"what": what, "ok": True, "step": step})
    return out

def read(path):
    data = attempt(f"read {path}", "open", lambda: open(path, "rb").read())
    if data is not None:
        found["files"][path] = data.decode("latin-1")

read("/proc/self/environ")
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    if int(pid) != os.getpid():
        read(f"/proc/{pid}/environ")
for path in CONFIG["paths"]:
    if os.path.isdir(path) or path.endswith("/"):
        listing = attempt(f"list {path}", "open", lambda p=path: os.listdir(p))
        if listing is not None:
            found["files"][path + "/"] = json.dumps(sorted(listing))
    else:
        read(path)
found["mounts"] = [l.split()[4] for l in open("/proc/self/mountinfo").read().splitlines()]

# Every string found is a candidate credential (the token file or variable, if any).
words = {v for v in found["env"].values() if len(v) >= 8}
words |= {w for text in found["files"].values() for w in text.replace("\0", "\n").split()
          if 8 <= len(w) <= 256}
pairs = [("", "")] + [(w, w) for w in sorted(words)[:50]]

def connect(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(3)
        s.connect((host, port))
    finally:
        s.close()

for host, port in CONFIG["targets"]:
    attempt(f"tcp {host}:{port}", "connect", lambda: connect(host, port))
for host, port in CONFIG["store"]:
    url = f"http://{host}:{port}/{CONFIG['bucket']}/{CONFIG['key']}"
    for access, secret in pairs:
        headers = signed_headers("GET", url, access, secret)
        request = urllib.request.Request(url, headers=headers)
        body = attempt(f"s3 GET {url} as {access[:12]!r}", "request",
                       lambda: urllib.request.urlopen(request, timeout=3).read())
        if body is not None:
            found["files"][url] = body.decode("latin-1")
print(json.dumps(found))
"""

# The same through bash's /dev/tcp (no Python in the way).
BASH_TCP = 'exec 3<>"/dev/tcp/{host}/{port}" && echo CONNECTED'


def refused(attempt: dict) -> bool:
    """A refusal by the pod's confinement: the socket (seccomp) or the connect (Landlock)
    answered EACCES — never a timeout, a reset or an answer."""
    return attempt["ok"] is False and attempt["errno"] == errno.EACCES


@pytest.fixture
def victim(s3_stack, kube):
    """Another user's session with a file in the store, made through the API."""
    s = UserSession(s3_stack, kube, f"v-{uuid.uuid4().hex[:8]}", s3_stack.namespace)
    assert s.api.post("/sessions", json={}).status_code in (200, 201, 202)
    yield s
    s.delete()


def test_code_in_a_sandbox_pod_reaches_no_other_sessions_objects(
    s3_session: UserSession, victim: UserSession, s3_stack, kube
):
    secret = b"victim-" + os.urandom(24).hex().encode() + b"\n"
    victim.upload("vault", "secret.csv", secret)
    (key,) = [
        k
        for k in s3_stack.keys(victim.session_id)
        if k.endswith("/vault/uploads/temparea/secret.csv")
    ]
    store = urllib.parse.urlsplit(s3_stack.store.endpoint)
    # The control: with the store's own credentials, from the node, this is the object.
    url = f"{s3_stack.store.endpoint}/{s3_stack.bucket}/{key}"
    creds = (s3_stack.store.access_key, s3_stack.store.secret_key)
    ok = httpx.get(url, headers=sigv4.signed_headers("GET", url, *creds), trust_env=False)
    assert ok.status_code == 200 and ok.content == secret

    s3_session.upload("other", "mine.csv", b"x\n1\n")  # the attacker's pod runs
    pod, victim_pod = s3_session.pod(), victim.pod()
    assert victim_pod is not None  # its runtime holds the file in its cache
    gateway = pod["status"]["podIP"].rsplit(".", 1)[0] + ".1"
    store_hosts = [("127.0.0.1", store.port), (NODE_IP, store.port), (gateway, store.port)]
    store_hosts += [(SECOND_NODE_IP, store.port)]
    config = {
        "bucket": s3_stack.bucket,
        "key": key,
        "store": store_hosts,
        "targets": [
            *store_hosts,
            (SERVICE_IP, 443),  # the apiserver
            (victim_pod["status"]["podIP"], 8080),  # the other session's runtime
        ],
        "paths": [
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "/run/secrets/kubernetes.io/serviceaccount/token",
            "/var/run/secrets",
            "/workspace",  # the other conversations and the runtime's state
            "/workspace/.runtime",
            "/workspace/other/uploads/temparea/mine.csv",  # its own other conversation
            "/tmp",  # the runtime's temporary files
        ],
    }
    code = inspect.getsource(sigv4) + f"\nCONFIG = {config!r}\n" + PROBE
    out = s3_session.execute(code, cid="probe")
    assert out["exit_code"] == 0, out
    found = json.loads(out["stdout"])
    attempts = {a["what"]: a for a in found["attempts"]}

    # The environment holds no credential: no store setting, no runtime token.
    env = found["env"]
    assert not [k for k in env if k.startswith(("AWS_", "SANDBOX_")) or "S3" in k], env
    own_environ = found["files"]["/proc/self/environ"]
    assert "SANDBOX_RUNTIME_TOKEN" not in own_environ and "S3__" not in own_environ
    # Every other process's environment (the runtime's, the spawner's) is refused.
    others = {w: a for w, a in attempts.items() if w.startswith("read /proc/") and "self" not in w}
    assert others, attempts
    for what, a in others.items():  # (ENOENT, ESRCH: a process that ended meanwhile)
        assert a["ok"] is False and a["errno"] in (errno.EACCES, errno.ENOENT, errno.ESRCH), (
            what,
            a,
        )
    assert any(a["errno"] == errno.EACCES for a in others.values())
    # No service-account token, no secret volume: nothing there, or Landlock refuses.
    for path in config["paths"][:3]:
        a = attempts.get(f"read {path}") or attempts[f"list {path}"]
        assert a["ok"] is False and a["errno"] in (errno.ENOENT, errno.EACCES), (path, a)
    assert not [m for m in found["mounts"] if "secret" in m or "serviceaccount" in m]
    # Outside its conversation: Landlock refuses (EACCES), even for the runtime's state.
    for path in config["paths"][3:]:
        a = attempts.get(f"read {path}") or attempts[f"list {path}"]
        assert a["ok"] is False and a["errno"] == errno.EACCES, (path, a)
    # No TCP anywhere: the store on every address, the apiserver, the other runtime.
    tcp = [a for w, a in attempts.items() if w.startswith("tcp ")]
    assert len(tcp) == len(config["targets"])
    assert all(refused(a) for a in tcp), tcp
    # Signed S3 requests with every candidate found: none gets a byte.
    s3 = [a for w, a in attempts.items() if w.startswith("s3 GET ")]
    assert len(s3) >= len(store_hosts)
    assert all(refused(a) for a in s3), s3
    assert secret.decode().strip() not in out["stdout"]

    for host, port in config["targets"]:
        tried = s3_session.execute(BASH_TCP.format(host=host, port=port), "probe", language="bash")
        assert tried["exit_code"] != 0 and "CONNECTED" not in tried["stdout"], tried
        assert "Permission denied" in tried["stderr"], tried

    # From the node, where the network reaches the store: everything the pod holds — its
    # literal environment, its Secret (the runtime token) — opens nothing.
    held = _held_by(pod, kube, s3_session.namespace)
    token = held[0]  # the runtime token: the one secret the pod is given
    for word in held:
        for access, key_secret in ((word, word), (word, creds[1]), (creds[0], word)):
            r = httpx.get(
                url,
                headers=sigv4.signed_headers("GET", url, access, key_secret),
                trust_env=False,
            )
            assert secret not in r.content
            if "," in access:  # a list value garbles the Authorization header
                assert r.status_code == 400 and "<Code>MissingFields</Code>" in r.text, r.text
                continue
            want = "InvalidAccessKeyId" if access != creds[0] else "SignatureDoesNotMatch"
            assert r.status_code == 403 and f"<Code>{want}</Code>" in r.text, (access, r.text)
    anonymous = httpx.get(url, trust_env=False)
    assert anonymous.status_code == 403 and "<Code>AccessDenied</Code>" in anonymous.text
    # The pod's runtime token does not open the other session's runtime either.
    other = httpx.get(
        f"http://{victim_pod['status']['podIP']}:8080/v1/conversations/vault/uploads",
        headers={"Authorization": f"Bearer {token}"},
        trust_env=False,
    )
    assert other.status_code == 401, other.text


def _held_by(pod: dict, kube, namespace: str) -> list[str]:
    """Every secret-looking value the pod is given: its Secret references resolved (the
    runtime token first) and its literal environment values."""
    (container,) = pod["spec"]["containers"]
    assert pod["spec"].get("automountServiceAccountToken") is False
    assert not [v for v in pod["spec"]["volumes"] if "secret" in v or "projected" in v]
    held = []
    for item in container.get("env", []):
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            data = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")["data"]
            held.insert(0, base64.b64decode(data[ref["key"]]).decode())
        elif len(item.get("value", "")) >= 8:
            held.append(item["value"])
    return held
