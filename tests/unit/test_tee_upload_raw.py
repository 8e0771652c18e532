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
