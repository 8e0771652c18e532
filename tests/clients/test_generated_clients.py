"""Clients generated from the contract call the API: the README's walk-through (upload,
list, download, execute, delete) through each, against a live ``sandbox-workspace dev``.

Two generators a team reaches for: ``openapi-python-client`` (PyPI, pinned in the dev
extra) and ``@hey-api/openapi-ts`` (npm, pinned in tests/clients/package-lock.json, which
scripts/install-node-deps.sh installs). Each generates once per run, from the server's own
``/openapi.json``, into a temporary directory; each must keep every operation of the
document (a ``const`` header once made the Python one drop ``list_files``,
``download_file`` and ``delete_file``), and each authenticates through the document's
``userId`` security scheme rather than a header added by hand.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
NODE = shutil.which("node")
CSV = b"city,temp\nParis,15\nOslo,5\n"
PACKAGE = "sbw_generated"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@pytest.fixture(scope="module")
def contract(dev_server, tmp_path_factory) -> tuple[dict, Path]:
    document = httpx.get(f"{dev_server.url}/openapi.json", timeout=30).json()
    path = tmp_path_factory.mktemp("contract") / "openapi.json"
    path.write_text(json.dumps(document))
    return document, path


def _operation_ids(document: dict) -> set[str]:
    return {op["operationId"] for ops in document["paths"].values() for op in ops.values()}


@pytest.fixture(scope="module")
def python_client(contract, tmp_path_factory):
    _, path = contract
    out = tmp_path_factory.mktemp("python-client")
    generate = ["generate", "--path", str(path), "--meta", "none"]
    result = subprocess.run(
        [str(BIN / "openapi-python-client"), *generate, "--output-path", str(out / PACKAGE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_python_client_has_every_operation(contract, python_client):
    document, _ = contract
    generated = {
        module.stem
        for module in Path(python_client.__file__).parent.glob("api/*/*.py")
        if module.stem != "__init__"
    }
    assert _operation_ids(document) - generated == set()


def _op(tag: str, operation: str):
    return importlib.import_module(f"{PACKAGE}.api.{tag}.{operation}")


def test_python_client_walkthrough(dev_server, python_client):
    models = importlib.import_module(f"{PACKAGE}.models")
    user = f"py-{uuid.uuid4().hex[:8]}"
    sid, cid = f"sb-session-{user}", "conv-py"
    # The userId scheme: X-User-Id carries the user, with no prefix (AuthenticatedClient's
    # own knobs for an apiKey header).
    client = python_client.AuthenticatedClient(
        base_url=dev_server.url, token=user, auth_header_name="X-User-Id", prefix=""
    )
    body = models.CreateSessionRequest(user_id=user)
    created = _op("sessions", "create_session").sync_detailed(client=client, body=body)
    assert created.status_code == 201, created.content
    try:
        upload = models.UploadFileBody(
            file=python_client.types.File(payload=io.BytesIO(CSV), file_name="weather.csv"),
            conversation_id=cid,
        )
        uploaded = _op("files", "upload_file").sync(sid, client=client, body=upload)
        assert isinstance(uploaded, models.FileUploaded), uploaded
        assert uploaded.path.endswith("/uploads/temparea/weather.csv")

        list_files = _op("files", "list_files")
        temparea = models.ListFilesSubdir.TEMPAREA
        listed = list_files.sync(
            sid, client=client, conversation_id_header=cid, subdir_header=temparea
        )
        assert listed.files == ["weather.csv"], listed

        # The body is the file's own bytes (`*/*`): the generator leaves it unparsed, so
        # the detailed answer's content is the file.
        downloaded = _op("files", "download_file").sync_detailed(
            sid, "weather.csv", client=client, conversation_id_query=cid
        )
        assert (downloaded.status_code, downloaded.content) == (200, CSV)

        code = "import pandas as pd\nprint(pd.read_csv('uploads/temparea/weather.csv').temp.mean())"
        request = models.ExecuteApiRequest(
            language=models.ExecuteApiRequestLanguage.PYTHON, code=code, conversation_id=cid
        )
        ran = _op("execute", "execute").sync(sid, client=client, body=request)
        assert ran.exit_code == 0 and ran.stdout.strip() == "10.0", ran

        delete_file = _op("files", "delete_file")
        deleted = delete_file.sync(sid, "weather.csv", client=client, conversation_id_query=cid)
        assert isinstance(deleted, models.FileDeleted), deleted
        assert list_files.sync(sid, client=client, conversation_id_query=cid).files == []
    finally:
        gone = _op("sessions", "delete_session").sync_detailed(sid, client=client)
        assert gone.status_code == 200, gone.content


needs_node = pytest.mark.skipif(
    NODE is None or (shutil.which("npm") is None and not (HERE / "node_modules").is_dir()),
    reason="node/npm are not installed (the TypeScript client is generated and run on them)",
)


@pytest.fixture(scope="module")
def typescript_client(contract, tmp_path_factory) -> Path:
    if not (HERE / "node_modules" / "@hey-api" / "openapi-ts").is_dir():
        subprocess.run(
            ["bash", str(HERE.parents[1] / "scripts" / "install-node-deps.sh")], check=True
        )
    _, path = contract
    out = tmp_path_factory.mktemp("typescript-client")
    tools = HERE / "node_modules" / ".bin"
    result = subprocess.run(
        [str(tools / "openapi-ts"), "-i", str(path), "-o", str(out / "gen")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    shutil.copy(HERE / "generated_walkthrough.ts", out / "walkthrough.ts")
    # CommonJS, so the generator's extension-less imports resolve as written.
    config = {
        "compilerOptions": {
            "target": "ES2022",
            "module": "commonjs",
            "moduleResolution": "node10",
            "lib": ["ES2022", "DOM", "DOM.Iterable"],
            "strict": True,
            "skipLibCheck": True,
            "ignoreDeprecations": "5.0",
            "outDir": "out",
        },
        "files": ["walkthrough.ts"],
    }
    (out / "tsconfig.json").write_text(json.dumps(config))
    result = subprocess.run(
        [str(tools / "tsc"), "-p", str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@needs_node
def test_typescript_client_has_every_operation(contract, typescript_client):
    document, _ = contract
    sdk = (typescript_client / "gen" / "sdk.gen.ts").read_text()
    generated = set(re.findall(r"^export const (\w+) =", sdk, re.MULTILINE))
    assert {_camel(i) for i in _operation_ids(document)} - generated == set()


@needs_node
def test_typescript_client_walkthrough(dev_server, typescript_client, tmp_path):
    user = f"ts-{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [NODE, str(typescript_client / "out" / "walkthrough.js")],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SANDBOX_API_URL": dev_server.url}
        | {"SANDBOX_TEST_USER": user},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "walk-through ok" in result.stdout
