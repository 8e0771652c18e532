"""The web page at /ui/ in a real headless Chromium (Debian's, driven by Playwright).

One walk through what a newcomer does: choose a user, create a conversation, upload a
CSV (listed with size and sha256), ask for a chart, watch the tool step wait for
approval, reload the page (the turn re-attaches to the run still waiting), approve, watch
the answer stream in, see the chart inline, download it and the upload, delete the file,
delete the conversation and see it gone — on the page and on the server. Screenshots of
each step are kept in build/browser/ (one of them is docs/web-ui.png in the README).
"""

from __future__ import annotations

import hashlib
import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "browser"
CSV = b"month,sales\nJan,10\nFeb,25\nMar,42\n"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (scripts/install-system-deps.sh)"
    ),
]


@pytest.fixture
def page():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        # --no-sandbox: Chromium refuses its own sandbox as root (the test machine's user).
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        context.set_default_timeout(30_000)
        sync_api.expect.set_options(timeout=30_000)  # a first upload starts the session
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def sign_in(page, url: str, user: str) -> None:
    """Open the page and choose a user (dev mode: no token)."""
    page.goto(f"{url}/ui/")
    page.fill("#user", user)
    page.click("#identity button[type=submit]")
    sync_api.expect(page.locator("#session-status")).to_contain_text("no session yet")


def new_conversation(page, name: str) -> None:
    page.fill("#conversation-name", name)
    page.click("#new-conversation button")
    sync_api.expect(page.locator("#current-conversation")).to_have_text(f"in {name}")


def upload(page, path: Path, data: bytes = CSV):
    """Upload ``data`` as ``path``'s name; answer its row in the uploads table, visible."""
    path.write_bytes(data)
    page.set_input_files("#file", str(path))
    page.click("#upload button[type=submit]")
    row = page.locator(f"#uploads tbody tr[data-name='{path.name}']")
    sync_api.expect(row).to_be_visible()
    return row


def delete_session(url: str, user: str, **headers: str) -> None:
    httpx.delete(
        f"{url}/api/v1/sessions/sb-session-{user}",
        headers={"X-User-Id": user, **headers},
        timeout=30,
    )


def test_upload_ask_approve_chart_download_delete(page, ui_server, tmp_path):
    expect = sync_api.expect
    user = f"web-{uuid.uuid4().hex[:8]}"
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        sign_in(page, ui_server.url, user)
        # Which model answers is on the page before the first message.
        expect(page.locator("#model")).to_have_text("Answered by: scripted")
        new_conversation(page, "sales-review")

        # Upload with progress; the list shows name, size, time and sha256.
        row = upload(page, tmp_path / "sales.csv")
        expect(page.locator("#upload-progress")).to_have_attribute("value", "100")
        expect(row.locator("td").nth(2)).to_have_text(f"{len(CSV)} B")
        expect(row.locator("td.mono")).to_have_attribute("title", hashlib.sha256(CSV).hexdigest())
        # A file name is data, never markup: one that is an HTML payload shows as text.
        hostile = "<img src=x onerror=window.pwned=1>.csv"
        r = httpx.post(
            f"{ui_server.url}/api/v1/sessions/sb-session-{user}/files/upload",
            headers={"X-User-Id": user},
            data={"conversation_id": "sales-review"},
            files={"file": (hostile, b"a,b\n")},
        )
        assert r.status_code == 201, r.text
        page.click("#conversation-list [data-conversation='sales-review']")  # re-list
        expect(page.locator("#uploads tbody tr")).to_have_count(2)
        expect(page.locator("#uploads tbody td", has_text=hostile)).to_have_count(1)
        assert page.evaluate("window.pwned") is None
        page.locator("#uploads tbody tr", has_text=hostile).locator("input.select").uncheck()
        path = row.locator("input.select").get_attribute("value")
        assert path.endswith("/sales-review/uploads/temparea/sales.csv")
        shot(page, "1-uploaded")

        # Ask: the tool step shows its code and waits for approval.
        page.fill("#query", "Plot the monthly sales")
        page.click("#send")
        step = page.locator(".tool[data-call='call_chart']")
        expect(step.locator("button.approve")).to_be_visible()
        expect(step.locator(".args")).to_contain_text("plt.savefig")
        expect(step.locator(".args")).to_contain_text(path)  # the selected upload's real path
        shot(page, "2-approval")

        # A reload re-attaches to the run, still waiting for the decision.
        page.reload()
        step = page.locator(".tool[data-call='call_chart']")
        expect(step.locator("button.approve")).to_be_visible()
        step.locator("button.approve").click()
        expect(step.locator(".badge")).to_have_text("done", timeout=60_000)

        # The answer streams in word by word.
        answer = page.locator(".assistant .text").last
        lengths: set[int] = set()
        deadline = time.monotonic() + 30
        while "best month" not in (answer.text_content() or ""):
            lengths.add(len(answer.text_content() or ""))
            assert time.monotonic() < deadline, "the answer never completed"
            time.sleep(0.03)
        assert len(lengths - {0}) >= 3, f"the answer arrived at once, not streamed: {lengths}"
        expect(page.locator(".tool[data-call='call_present'] .badge")).to_have_text("done")

        # The chart inline, and its download.
        image = page.locator(".outputs img.inline-image")
        expect(image).to_be_visible()
        page.wait_for_function("document.querySelector('.outputs img').naturalWidth > 100")
        shot(page, "3-answer")
        with page.expect_download() as chart:
            page.click(".outputs a.download")
        assert chart.value.suggested_filename == "chart.png"
        assert Path(chart.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # The upload's download, then its deletion.
        with page.expect_download() as uploaded:
            row.locator("button.download").click()
        assert Path(uploaded.value.path()).read_bytes() == CSV
        row.locator("button.delete").click()
        expect(row).to_have_count(0)

        # Delete the conversation: gone from the page and from the server.
        page.click("#delete-conversation")
        expect(page.locator("#conversation-list [data-conversation='sales-review']")).to_have_count(
            0
        )
        shot(page, "4-deleted")
        listing = httpx.get(
            f"{ui_server.url}/api/v1/sessions/sb-session-{user}/files",
            params={"conversation_id": "sales-review"},
            headers={"X-User-Id": user},
        )
        assert listing.status_code in (200, 404)
        assert listing.status_code == 404 or listing.json()["files"] == []
        assert errors == [], errors
    finally:
        delete_session(ui_server.url, user)


def test_token_mode_asks_for_a_token_and_uses_it(page, start_server, tmp_path):
    token = "t" * 24
    server = start_server(
        "api",
        SANDBOX_WORKSPACE_AUTH_MODE="required",
        SANDBOX_WORKSPACE_SERVICE_TOKEN=token,
        SANDBOX_WORKSPACE_WEB_UI="true",
        SANDBOX_WORKSPACE_DATA_DIR=str(tmp_path / "data"),
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
    )
    expect = sync_api.expect
    user = f"tok-{uuid.uuid4().hex[:8]}"
    try:
        page.goto(f"{server.url}/ui/")
        expect(page.locator("#token-field")).to_be_visible()  # hidden in dev mode
        page.fill("#user", user)
        page.fill("#token", "wrong-token-wrong-token")
        page.click("#identity button[type=submit]")
        expect(page.locator("#session-status")).to_contain_text("invalid bearer token")  # 401
        page.fill("#token", token)
        page.click("#identity button[type=submit]")
        expect(page.locator("#session-status")).to_contain_text("no session yet")
        new_conversation(page, "tokens")
        upload(page, tmp_path / "t.csv")
        # The token stays in this tab only: sessionStorage, never localStorage.
        assert page.evaluate("sessionStorage.getItem('token')") == token
        assert token not in page.evaluate("JSON.stringify(localStorage)")
    finally:
        delete_session(server.url, user, Authorization=f"Bearer {token}")


def test_overlapping_refreshes_list_each_upload_once(page, ui_server, tmp_path):
    """Two refreshes of the uploads table in flight at once (an upload's own and a
    conversation switch, as in a slow network) end with one row per file, not one per
    refresh: the listings are held until both are asked for, then answered together."""
    expect = sync_api.expect
    user = f"dup-{uuid.uuid4().hex[:8]}"
    try:
        sign_in(page, ui_server.url, user)
        new_conversation(page, "overlap")
        upload(page, tmp_path / "once.csv")
        rows = page.locator("#uploads tbody tr")
        expect(rows).to_have_count(1)

        held: list = []
        page.route("**/files?conversation_id=*", lambda route: held.append(route))
        transcripts: list[str] = []
        page.on(
            "requestfinished",
            lambda r: transcripts.append(r.url) if r.url.endswith("/runs") else None,
        )
        button = page.locator("#conversation-list button[data-conversation='overlap']")
        button.click()
        button.click()
        deadline = time.monotonic() + 30
        while len(held) < 2:
            assert time.monotonic() < deadline, f"only {len(held)} listings were asked for"
            page.wait_for_timeout(20)  # lets Playwright deliver the route events
        for route in held:
            route.continue_()
        # Each selection lists the uploads, then redraws the transcript (GET …/runs):
        # once both transcripts are fetched, both refreshes have drawn their rows.
        deadline = time.monotonic() + 30
        while len(transcripts) < 2:
            assert time.monotonic() < deadline, "the transcripts were never redrawn"
            page.wait_for_timeout(20)
        expect(rows).to_have_count(1)
        assert page.locator("#uploads tbody tr[data-name='once.csv']").count() == 1
    finally:
        delete_session(ui_server.url, user)


def test_snapshot_restore_and_fork_from_the_page(page, ui_server, tmp_path):
    """Snapshot a conversation, upload more, restore (the later upload is gone), fork:
    the fork is selected and holds the files."""
    expect = sync_api.expect
    user = f"web-{uuid.uuid4().hex[:8]}"
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        sign_in(page, ui_server.url, user)
        new_conversation(page, "branching")
        upload(page, tmp_path / "first.csv")
        page.click("#take-snapshot")
        expect(page.locator("#snapshot-list li")).to_have_count(1)
        later = upload(page, tmp_path / "later.csv")
        page.locator("#snapshot-list li button.restore").click()
        expect(page.locator("#snapshot-status")).to_contain_text("Python restarted")
        expect(later).to_have_count(0)
        expect(page.locator("#uploads tbody tr[data-name='first.csv']")).to_be_visible()

        page.click("#fork-conversation")
        expect(page.locator("#current-conversation")).to_contain_text("in fork-")
        expect(page.locator("#uploads tbody tr[data-name='first.csv']")).to_be_visible()
        expect(page.locator("#snapshot-list li")).to_have_count(0)  # the fork's own
        assert errors == [], errors
    finally:
        delete_session(ui_server.url, user)
