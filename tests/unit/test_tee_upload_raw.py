"""``TeeUpload`` (api/backends/store_upload.py) in raw mode, over a real ``DirStore``: once
the put starts, the runtime gets the file's bytes in the store's chunks and then the
trailer the runtime reads (``runtime/raw_upload.py``); the object is the same bytes."""

from __future__ import annotations

import asyncio
import hashlib

from sandbox_workspace.api.backends.store_upload import TeeUpload
from sandbox_workspace.runtime.raw_upload import Trailer, encode_trailer
from sandbox_workspace.runtime.schemas import UploadResult
from sandbox_workspace.store.dirstore import DirStore

BOUNDARY = "tee"


def _form(data: bytes, *, before: str = "", after: str = "") -> list[bytes]:
    head = (
        f'{before}--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        'filename="a%22b.txt"\r\nContent-Type: text/plain\r\n\r\n'
    ).encode()
    tail = f"\r\n{after}--{BOUNDARY}--\r\n".encode()
    body = head + data + tail
    return [body[i : i + 65536] for i in range(0, len(body), 65536)]  # as a server reads


def _field(name: str, value: str) -> str:
    return f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'


async def _source(chunks: list[bytes]):
    for chunk in chunks:
        yield chunk


def _run(tmp_path, chunks: list[bytes], given: str | None, settle_with=None):
    async def go():
        store = DirStore(tmp_path)
        await store.check()
        tee = TeeUpload(
            store, lambda cid, name: f"{cid}/{name}", _source(chunks),
            f"multipart/form-data; boundary={BOUNDARY}", given,
        )  # fmt: skip
        params = await tee.open()
        sent = [chunk async for chunk in tee.body()]
        stored = None
        if settle_with is not None and await tee.settle(settle_with(tee)) is not None:
            stored = await _read(store, tee.key)
        else:
            await tee.settle(None)
        return stored, tee, params, sent

    return asyncio.run(go())


def test_the_runtime_gets_the_files_bytes_then_the_trailer(tmp_path):
    data = bytes(range(256)) * 20_000  # 5 MB: several store chunks
    form = _form(data, before=_field("description", "d"), after=_field("subdir", "temparea"))
    sha = hashlib.sha256(data).hexdigest()

    def committed(tee):  # what the runtime answers once it committed those bytes
        return UploadResult(
            conversation_id="c1", name='a"b.txt', size=len(data), sha256=sha,
            mime_type="text/plain", uploaded_at="2026-11-27T00:00:00+00:00",
            path="/w/c1/uploads/temparea/x", replaced=False,
        )  # fmt: skip

    stored, tee, params, sent = _run(tmp_path, form, "c1", committed)
    assert tee.raw
    assert params == {"conversation_id": "c1", "filename": 'a"b.txt'}
    trailer = encode_trailer(Trailer(fields={"subdir": "temparea"}, size=len(data), sha256=sha))
    assert sent[-1] == trailer
    assert b"".join(sent[:-1]) == data
    assert max(len(c) for c in sent[:-1]) <= 1024 * 1024 + 65536  # the store's chunks
    assert tee.description() == "d"
    assert stored == data  # the object is completed: the same bytes


def test_a_conversation_named_before_the_file_goes_with_it(tmp_path):
    _, tee, params, sent = _run(tmp_path, _form(b"x", before=_field("conversation_id", "c2")), None)
    assert tee.raw and params["conversation_id"] == "c2"
    assert Trailer.model_validate_json(sent[-1][:-8]).fields == {"conversation_id": "c2"}


def test_without_a_put_the_form_goes_on_as_it_came(tmp_path):
    form = _form(b"l" * 200_000, after=_field("conversation_id", "c3"))  # read after open
    _, tee, params, sent = _run(tmp_path, form, None)
    assert not tee.raw and params == {}
    assert b"".join(sent) == b"".join(form)


async def _read(store, key: str) -> bytes:
    download = await store.get(key)
    return b"".join([chunk async for chunk in download])


def test_a_runtime_that_takes_no_raw_uploads_gets_the_form_and_no_put(tmp_path):
    form = _form(b"x" * 1000, before=_field("conversation_id", "c4"))

    async def go():
        store = DirStore(tmp_path)
        await store.check()
        tee = TeeUpload(
            store, lambda cid, name: f"{cid}/{name}", _source(form),
            f"multipart/form-data; boundary={BOUNDARY}", None, raw=False,
        )  # fmt: skip
        params = await tee.open()
        return tee, params, [chunk async for chunk in tee.body()]

    tee, params, sent = asyncio.run(go())
    assert not tee.raw and tee.key is None and params == {}
    assert b"".join(sent) == b"".join(form)


class _Health:
    """A loopback HTTP server answering /healthz with ``body`` (or not at all)."""

    def __init__(self) -> None:
        self.body: bytes | None = b'{"status": "ok"}'  # a runtime of the first release
        self.asked = 0

    async def serve(self):
        async def answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            self.asked += 1
            if self.body is None:
                writer.close()
                return
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.body)}\r\n"
            writer.write(head.encode() + b"Content-Type: application/json\r\n\r\n" + self.body)
            await writer.drain()
            writer.close()

        return await asyncio.start_server(answer, "127.0.0.1", 0)


def test_the_api_asks_each_runtime_once_whether_it_takes_raw_uploads(tmp_path):
    import httpx

    from sandbox_workspace.api.backends.base import RuntimeEndpoint
    from sandbox_workspace.api.backends.store_backend import StoreBackend
    from sandbox_workspace.api.runtime_client import RuntimeClient
    from sandbox_workspace.store.layout import Layout

    async def go():
        health = _Health()
        server = await health.serve()
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server, httpx.AsyncClient() as http:
            backend = StoreBackend(None, http, DirStore(tmp_path), Layout("w/"))
            client = RuntimeClient(http, RuntimeEndpoint(url=url, token="t"))
            health.body = None  # no answer: not raw, and asked again next time
            assert await backend._takes_raw_uploads(client, "") is False
            health.body = b'{"status": "ok"}'  # an older release: forms
            assert await backend._takes_raw_uploads(client, "") is False
            assert await backend._takes_raw_uploads(client, "") is False
            assert health.asked == 2  # the answer is kept
            # A new pod at the same address, of this release: asked, and raw.
            health.body = b'{"status": "ok", "features": ["raw_upload"]}'
            assert await backend._takes_raw_uploads(client, "pod-2") is True
            assert await backend._takes_raw_uploads(client, "pod-2") is True
            assert health.asked == 3

    asyncio.run(go())
