"""Hostile agent code, as data, and one driver that plays it through the public API.

Every attack runs as conversation A's code and tries to reach conversation B, the
runtime's state, the rest of the machine, the network or the runtime's processes. An
attack prints one JSON line: what leaked (must be nothing), what was refused with a
permission error (must be something — an attack that only met "no such file" proved
nothing and fails as inconclusive), and what was inconclusive.

Any tier runs the whole catalogue with one line::

    run_hostile_suite(client, f"/api/v1/sessions/{sid}")   # client: httpx.Client with auth

``network="allow"`` when the session allows network: the network attacks then expect to
connect and send. Afterwards the driver checks that the sandbox is healthy: B's file and state are
intact, upload, list, download and execute still work.
"""

# The attacks are code as data: their long lines stay whole.
# ruff: noqa: E501

from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx

PRELUDE = r"""
import errno, json, os, socket, signal
_leaks, _refused, _odd = [], 0, []
def attempt(what, fn, ignore=()):
    global _refused
    try:
        out = fn()
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EXDEV, errno.EROFS):
            _refused += 1
        elif e.errno not in ignore:
            _odd.append(f"{what}: {e!r}")
        return
    _leaks.append(f"{what}: {out!r}"[:300])
def read(path, **kw):
    with open(path, **kw) as f:
        return f.read()
def write(path):
    with open(path, "w") as f:
        return f.write("hostile")
def probe(path):  # a write outside that succeeds is a leak; it leaves nothing behind
    write(path)
    os.unlink(path)
    return "written"
"""
EPILOGUE = r"""
print(json.dumps({"leaks": _leaks, "refused": _refused, "odd": _odd}))
"""


@dataclass(frozen=True)
class Attack:
    name: str
    code: str  # Python, formatted with the scene (``{b_file}``, ``{b_dir}``, ``{root}``…)
    must_refuse: bool = True  # at least one permission error expected
    language: str = "python"
    # With the network allowed, the leak (by this prefix) the attack must find instead:
    # proof it would see the network if confinement let it through.
    when_allowed: str = ""
    # Operations of this attack that succeed by design: residual risks stated in
    # docs/security.md ("Residual risks"); any other success is a leak.
    residual: tuple[str, ...] = ()


ATTACKS = [
    Attack(
        "inherited descriptors",
        """
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{{fd}}")
    except OSError:
        continue  # the fd of the listing itself, already closed
    if int(fd) > 4 or not (target.startswith("pipe:") or target == "/dev/null"):
        if not target.startswith("/proc/"):
            _leaks.append(f"fd {{fd}} -> {{target}}")
""",
        must_refuse=False,
    ),
    Attack(
        "relative path to another conversation",
        """
attempt("read", lambda: read("../{b}/uploads/temparea/{name}"))
attempt("list", lambda: os.listdir("../{b}"))
attempt("write", lambda: write("../{b}/outputs/planted.txt"))
attempt("delete", lambda: os.unlink("../{b}/uploads/temparea/{name}"))
attempt("rmdir", lambda: os.rmdir("../{b}/outputs"))
""",
    ),
    Attack(
        "absolute path to another conversation",
        """
attempt("read", lambda: read({b_file!r}))
attempt("truncate", lambda: os.truncate({b_file!r}, 0))
attempt("overwrite", lambda: write({b_file!r}))
attempt("rename", lambda: os.rename({b_file!r}, {b_file!r} + ".moved"))
""",
    ),
    Attack(
        "/proc/self/cwd/..",
        """
attempt("read", lambda: read("/proc/self/cwd/../{b}/uploads/temparea/{name}"))
attempt("list", lambda: os.listdir("/proc/self/cwd/.."))
""",
    ),
    Attack(
        "/proc/<pid>/root and /proc/<pid>/cwd of every process",
        """
me = os.getpid()
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    attempt(f"root of {{pid}}", lambda: read(f"/proc/{{pid}}/root{b_file}"), ignore=(errno.ENOENT, errno.ESRCH))
    if int(pid) != me:
        attempt(f"cwd of {{pid}}", lambda: os.listdir(f"/proc/{{pid}}/cwd"), ignore=(errno.ENOENT, errno.ESRCH))
""",
    ),
    Attack(
        "symlinks the code makes",
        """
for name, target in (("ln-file", {b_file!r}), ("ln-dir", {b_dir!r}), ("ln-root", {root!r})):
    if os.path.lexists(name):
        os.unlink(name)
    os.symlink(target, name)
attempt("read through link", lambda: read("ln-file"))
attempt("list through link", lambda: os.listdir("ln-dir"))
attempt("write through link", lambda: write("ln-dir/outputs/planted.txt"))
attempt("list root through link", lambda: os.listdir("ln-root"))
""",
    ),
    Attack(
        "hard links and renames across conversations",
        """
write("own.txt")
attempt("link B's file here", lambda: os.link({b_file!r}, "hl-b"))
attempt("link ours into B", lambda: os.link("own.txt", {b_dir!r} + "/uploads/temparea/planted"))
attempt("rename ours into B", lambda: os.rename("own.txt", {b_dir!r} + "/outputs/planted"))
attempt("link /etc/passwd here", lambda: os.link("/etc/passwd", "hl-passwd"))
""",
    ),
    Attack(
        "openat with .. on a directory fd",
        """
here = os.open(".", os.O_PATH | os.O_DIRECTORY)
up = os.open("..", os.O_PATH | os.O_DIRECTORY)
attempt("openat(here, ../B/file)", lambda: os.read(os.open("../{b}/uploads/temparea/{name}", os.O_RDONLY, dir_fd=here), 100))
attempt("openat(up, B/file)", lambda: os.read(os.open("{b}/uploads/temparea/{name}", os.O_RDONLY, dir_fd=up), 100))
attempt("openat(up, B) for listing", lambda: os.listdir(os.open("{b}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=up)))
attempt("list root by fd", lambda: os.listdir(os.open("..", os.O_RDONLY | os.O_DIRECTORY)))
""",
    ),
    Attack(
        "the runtime's state and the workspace root",
        """
attempt("list root", lambda: os.listdir({root!r}))
attempt("list .runtime", lambda: os.listdir({root!r} + "/.runtime"), ignore=(errno.ENOENT,))
attempt("write .runtime", lambda: os.makedirs({root!r} + "/.runtime/planted"))
attempt("move .runtime away", lambda: os.rename({root!r} + "/.runtime", {root!r} + "/gone"), ignore=(errno.ENOENT,))
attempt("new conversation dir", lambda: os.mkdir({root!r} + "/planted"))
""",
    ),
    Attack(
        "writing outside: /tmp, /etc, other scratch dirs",
        """
scratch = os.environ["TMPDIR"]
write(os.path.join(scratch, "own-scratch-works.txt"))
attempt("/tmp", lambda: probe("/tmp/sbw-hostile-probe"))
attempt("/etc", lambda: probe("/etc/sbw-hostile-probe"))
attempt("/var/tmp", lambda: probe("/var/tmp/sbw-hostile-probe"))
attempt("/dev/shm", lambda: probe("/dev/shm/sbw-hostile-probe"), ignore=(errno.ENOENT,))
attempt("scratch parent list", lambda: os.listdir(os.path.dirname(scratch)))
attempt("B's scratch", lambda: write(os.path.join(os.path.dirname(scratch), "{b}", "planted")))
attempt("the interpreter", lambda: probe(os.path.join(os.path.dirname(os.__file__), "planted.py")))
""",
    ),
    Attack(
        "grep -r from /",
        """
import subprocess
out = subprocess.run(
    ["grep", "-rlIF", {marker!r}, "/", "--exclude-dir=proc", "--exclude-dir=sys",
     "--exclude-dir=dev", "--exclude-dir=usr"],
    capture_output=True, text=True, timeout=120,
).stdout
_leaks.extend(line for line in out.splitlines() if "{b}" in line)
attempt("grep B directly", lambda: read({b_file!r}))
""",
    ),
    Attack(
        "TCP: connect to every listening port, bind a port",
        """
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = read(table).splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
# Under the local backend's egress namespaces the relay to the egress proxy listens here by
# design (HTTP_PROXY names it): it is the sandbox's way out, judged by the proxy
# (tests/api/test_egress_local.py). Every other port stays an attack.
_relay = os.environ.get("HTTP_PROXY", "")
if _relay.startswith("http://127.0.0.1:"):
    ports.discard(int(_relay.rsplit(":", 1)[1]))
if not ports and not _relay:
    _odd.append("no listening TCP port found to attack")
connected = []
def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        connected.append(port)
        return port
for port in sorted(ports):
    attempt(f"connect {{port}}", lambda: connect(port), ignore=(errno.ECONNREFUSED, errno.ETIMEDOUT))
def bind(port):
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    s.close()
    return port
attempt("bind an ephemeral port", lambda: bind(0))
attempt("bind 8099", lambda: bind(8099), ignore=(errno.EADDRINUSE,))
""",
        when_allowed="connect",
    ),
    Attack(
        "network beyond TCP: UDP, ICMP, listen unbound, io_uring, the i386 ABI",
        """
import ctypes, mmap, platform
def udp_send():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return s.sendto(b"exfiltrated", ("127.0.0.1", 9))
    finally:
        s.close()
attempt("udp send", udp_send)
def created(*args):
    socket.socket(*args).close()
    return "created"
attempt("udp6 socket", lambda: created(socket.AF_INET6, socket.SOCK_DGRAM), ignore=(errno.EAFNOSUPPORT,))
attempt("icmp socket", lambda: created(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
attempt("raw socket", lambda: created(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP))
def listen_unbound():  # listen() binds an ephemeral port by itself
    s = socket.socket()
    try:
        s.listen()
        return s.getsockname()
    finally:
        s.close()
attempt("listen without bind", listen_unbound)
libc = ctypes.CDLL(None, use_errno=True)
def uring():  # io_uring makes sockets without the socket syscall
    fd = libc.syscall(425, 4, ctypes.create_string_buffer(120))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    os.close(fd)
    return "ring"
attempt("io_uring_setup", uring, ignore=(errno.ENOSYS,))
def i386_socket():  # int 0x80 from a 64-bit process: the i386 table's socket (359)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child: a kernel without the i386 ABI kills it, not us
        code = bytes.fromhex("53B867010000BB02000000B90200000031D2CD805BC3")
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(code)
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        os.write(w, str(fn()).encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    result = int(out or b"-38")
    if result < 0:
        raise OSError(-result, "int 0x80 socket")
    return "i386 socket"
if platform.machine() == "x86_64":
    attempt("i386 socket", i386_socket, ignore=(errno.ENOSYS,))
""",
        when_allowed="udp send",
    ),
    Attack(
        "signals to the runtime, its helpers and other conversations",
        """
def parent(pid):
    with open(f"/proc/{{pid}}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
chain, pid = [], os.getpid()
for _ in range(3):  # reaper, spawner, runtime
    pid = parent(pid)
    if pid <= 1:
        break
    chain.append(pid)
for pid in chain:
    attempt(f"SIGKILL {{pid}}", lambda: os.kill(pid, signal.SIGKILL), ignore=(errno.ESRCH,))
def below_our_runtime(pid):  # never touch interpreters of other runtimes on this machine
    try:
        while pid > 1:
            pid = parent(pid)
            if pid == chain[-1]:
                return True
    except OSError:
        pass
    return False
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    try:
        cmdline = read(f"/proc/{{pid}}/cmdline", mode="rb")
    except OSError:
        continue
    if b"kernel_main" in cmdline and below_our_runtime(pid):
        attempt(f"SIGKILL kernel {{pid}}", lambda: os.kill(pid, signal.SIGKILL), ignore=(errno.ESRCH,))
""",
    ),
    Attack(
        "abstract unix socket of another conversation",
        """
def connect(address):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(address)
        return "connected"
attempt("connect", lambda: connect("\\0sbw-hostile-{b}"))
""",
    ),
    Attack(
        # A daemon's socket on the machine (docker.sock, containerd's, D-Bus) is the whole
        # machine where the runtime runs as root; Landlock has no right for it before ABI 9.
        "named unix sockets: the machine's daemons, another conversation's",
        """
named = set()
try:
    for line in read("/proc/net/unix").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[3] == "00010000" and fields[7].startswith("/"):
            named.add(fields[7])  # listening, with a path
except OSError:
    pass
named.add("../{b}/outputs/hostile.sock")  # B's, when it could make one (relative: 108 bytes)
def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
        return "connected"
for path in sorted(named):
    attempt(f"connect {{path}}", lambda: connect(path), ignore=(errno.ENOENT, errno.ECONNREFUSED, errno.ETIMEDOUT))
def bind_outside():  # a socket of ours where B or the machine would look
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("/tmp/sbw-hostile-{a}.sock")
        os.unlink("/tmp/sbw-hostile-{a}.sock")
        return "bound"
attempt("bind in /tmp", bind_outside)
""",
    ),
    Attack(
        "B's shared memory and semaphores",
        """
import ctypes, mmap
scratch = os.environ["TMPDIR"]
b_shm = os.path.join(os.path.dirname(scratch), "{b}", "shm")
def by_name():  # through the preload library: A's own directory, where B's name is not
    from multiprocessing import shared_memory
    seg = shared_memory.SharedMemory(name="sbw-hostile-{b}")
    data = bytes(seg.buf[:64]); seg.close()
    return data
attempt("B's segment by name", by_name, ignore=(errno.ENOENT,))
def libc_shm_open():  # glibc's own shm_open, past the preload library: /dev/shm
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.shm_open(b"/sbw-hostile-{b}", os.O_RDONLY, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return os.read(fd, 64)
attempt("libc shm_open of B's name", libc_shm_open, ignore=(errno.ENOENT,))
attempt("list /dev/shm", lambda: os.listdir("/dev/shm"), ignore=(errno.ENOENT,))
attempt("list B's shm dir", lambda: os.listdir(b_shm))
attempt("read B's segment file", lambda: read(os.path.join(b_shm, "sbw-hostile-{b}"), mode="rb"))
attempt("plant in B's shm dir", lambda: write(os.path.join(b_shm, "sem.planted")))
""",
    ),
    Attack(
        "metadata of another conversation's files: stat, chmod, chown, utime, setxattr",
        """
attempt("stat", lambda: os.stat({b_file!r}).st_size)
attempt("chmod", lambda: os.chmod({b_file!r}, 0))
attempt("chmod dir", lambda: os.chmod(os.path.dirname({b_file!r}), 0))
attempt("utime", lambda: os.utime({b_file!r}, (0, 0)))
attempt("setxattr", lambda: os.setxattr({b_file!r}, "user.sbw", b"x"), ignore=(errno.ENOTSUP,))
attempt("chown to self", lambda: os.chown({b_file!r}, os.getuid(), os.getgid()))
attempt("read after chmod", lambda: read({b_file!r}))
attempt("list after chmod", lambda: os.listdir(os.path.dirname({b_file!r})))
""",
        residual=("stat", "chmod", "chmod dir", "utime", "setxattr", "chown to self"),
    ),
]

# Conversation B's set-up: an abstract socket it listens on (kept alive by its kernel),
# checked to be reachable from B itself, so A's refusal is the confinement at work.
B_SETUP = """
import os, socket
hostile_alive = True
hostile_listeners = []
try:  # B's own sockets, abstract and named, for A to find
    for address in ("\\0sbw-hostile-{b}", "outputs/hostile.sock"):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        listener.listen()
        hostile_listeners.append(listener)
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(address)
        probe.close()
except PermissionError:  # the network is denied: code may make no socket at all
    pass
try:  # B's shared memory (the preload library puts it in B's scratch space)
    from multiprocessing import shared_memory
    hostile_shm = shared_memory.SharedMemory(name="sbw-hostile-{b}", create=True, size=64)
    hostile_shm.buf[:len("{marker}")] = "{marker}".encode()
except OSError:  # no shim in this runtime: shared memory is denied outright
    pass
print("listening")
"""


def _execute(client: httpx.Client, session_url: str, cid: str, code: str, **extra) -> dict:
    r = client.post(
        f"{session_url}/execute",
        json={"conversation_id": cid, "language": "python", "code": code, "timeout": 180, **extra},
        timeout=240,
    )
    assert r.status_code == 200, r.text
    return r.json()


def _upload(client: httpx.Client, session_url: str, cid: str, name: str, data: bytes) -> dict:
    r = client.post(
        f"{session_url}/files/upload", files={"file": (name, data)}, data={"conversation_id": cid}
    )
    assert r.status_code in (200, 201), r.text
    return r.json()


def run_hostile_suite(client: httpx.Client, session_url: str, *, network: str = "deny") -> None:
    """Play every attack as conversation A against B; fail with every leak found, then
    check the sandbox is healthy."""
    scene, failures = play(client, session_url, ATTACKS, network=network)
    found = [f"{name}: {problem}" for name, problems in failures.items() for problem in problems]
    assert not found, "\n".join(found)
    _check_healthy(client, session_url, scene)


def play(
    client: httpx.Client,
    session_url: str,
    attacks: list[Attack],
    *,
    network: str = "deny",
    a: str | None = None,
    run_a: Callable[[str], str] | None = None,
) -> tuple[dict, dict[str, list[str]]]:
    """Set the scene (conversations A and B), run ``attacks``; per attack, what went wrong.

    ``a``/``run_a``: another way into A (conversation ``a``; ``run_a(code)`` runs Python
    there and answers its stdout), e.g. E2B's SDK; by default ``POST /execute``."""
    tag = uuid.uuid4().hex[:8]
    a = a or f"hostile-a-{tag}"
    b, name = f"hostile-b-{tag}", "secret.csv"
    if run_a is None:

        def run_a(code: str) -> str:
            return _execute(client, session_url, a, code)["stdout"]

    marker = f"sbw-secret-{uuid.uuid4().hex}"
    b_file = _upload(client, session_url, b, name, marker.encode())["path"]
    b_dir = posixpath.dirname(posixpath.dirname(posixpath.dirname(b_file)))
    scene = {
        "a": a, "b": b, "name": name, "b_file": b_file, "b_dir": b_dir, "marker": marker,
        "root": posixpath.dirname(b_dir),
    }  # fmt: skip
    setup = _execute(client, session_url, b, B_SETUP.format(**scene))
    assert setup["stdout"] == "listening\n", setup
    own = _upload(client, session_url, a, "own.csv", b"mine")
    control = run_a(f"print(open({own['path']!r}).read())")
    assert control == "mine\n", control

    failures: dict[str, list[str]] = {}
    for attack in attacks:
        out = run_a(PRELUDE + attack.code.format(**scene) + EPILOGUE)
        problems = failures.setdefault(attack.name, [])
        try:
            verdict = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            problems.append(f"no verdict: {out}")
            continue
        leaks, refused, odd = verdict["leaks"], verdict["refused"], verdict["odd"]
        if attack.when_allowed and network == "allow":
            if not any(leak.startswith(attack.when_allowed) for leak in leaks):
                problems.append(f"network is allowed but no {attack.when_allowed!r} went out")
            continue
        leaks = [leak for leak in leaks if leak.split(":", 1)[0] not in attack.residual]
        if leaks:
            problems.append(f"LEAKED {leaks}")
        if odd or (attack.must_refuse and not refused):
            problems.append(f"inconclusive (refused {refused}) {odd}")
    return scene, {name: problems for name, problems in failures.items() if problems}


def _check_healthy(client: httpx.Client, session_url: str, scene: dict) -> None:
    """B is intact and alive; A still uploads, lists, downloads and executes."""
    a, b, name, marker = scene["a"], scene["b"], scene["name"], scene["marker"]
    r = client.get(f"{session_url}/files/{name}", params={"conversation_id": b})
    assert r.status_code == 200 and r.text == marker, (r.status_code, r.text[:200])
    alive = _execute(client, session_url, b, "hostile_alive")
    assert alive["results"][0]["data"]["text/plain"] == "True", alive
    _upload(client, session_url, a, "after.csv", b"after")
    listed = client.get(f"{session_url}/files", params={"conversation_id": a}).json()
    assert {"after.csv", "own.csv"} <= set(listed["files"]), listed
    r = client.get(f"{session_url}/files/after.csv", params={"conversation_id": a})
    assert r.status_code == 200 and r.content == b"after"
    out = _execute(client, session_url, a, "echo still working", language="bash")
    assert out["stdout"] == "still working\n", out


# Sleepers forked up to the ceiling, and again whenever one ends, until stopped. Not a bash
# loop: bash gives up on a fork after ~15 s of retries and exits, its sleepers are
# killed with it and the ceiling is free again before the test looks (seen: exit 254).
# Each child execs sleep at once: forked Python copies would count against the memory
# limit per execution (copy-on-write pages count in both).
# posix_spawn (vfork-like), not fork + exec: a forked interpreter holds ~8 MB of resident
# memory until its exec, and on a loaded machine enough of them wait at once to pass the
# execution's memory limit (512Mi) — the filler was then killed before the ceiling, and the
# test failed in CI with "never reached".
HOLD_THE_CEILING = """python3 -c '
import os, shutil, time
sleep = shutil.which("sleep")
while True:
    try:
        os.posix_spawn(sleep, ["sleep", "120"], {})
    except OSError:
        time.sleep(0.02)
'"""


# Code that prints what a TCP connect to each port given (127.0.0.1) met: "made" or the
# errno's name (EACCES: Landlock refused it). Ports from the variables named.
def connect_probe(*port_vars: str) -> str:
    ports = ", ".join(f'int(os.environ["{v}"])' for v in port_vars)
    return f"""
import errno, os, socket
def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "made"
print(*(refused(p) for p in ({ports},)))
"""
