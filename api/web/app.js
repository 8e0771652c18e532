// The page: identity, conversations, uploads and the chat, wired to the public API.
// Kept in localStorage (per user): the identity, the conversations opened here, and each
// conversation's turns (query + run id) — so a reload redraws them and re-attaches to a
// run still going (GET /api/v1/runs/{id}/events replays from the start).

import { Api, formatSize } from "./api.js";
import { Turn } from "./transcript.js";

const $ = (id) => document.getElementById(id);
const store = {
  get: (key, fallback) => JSON.parse(localStorage.getItem(key) ?? "null") ?? fallback,
  set: (key, value) => localStorage.setItem(key, JSON.stringify(value)),
};

// The user id persists; a pasted token only for this tab (sessionStorage).
let api = new Api({ ...store.get("identity", { user: "dev" }), token: sessionStorage.getItem("token") || "" });
let cid = null;
const blobUrls = new Map();

function showError(error) {
  const box = $("error");
  box.textContent = error.message || String(error);
  box.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { box.hidden = true; }, 8000);
}

const key = (what) => `${what}:${api.userId}${cid ? `:${cid}` : ""}`;

async function fileUrl(url) {
  if (!blobUrls.has(url)) blobUrls.set(url, await api.blobUrl(url));
  return blobUrls.get(url);
}

// ---- identity and session -------------------------------------------------------
async function applyIdentity() {
  const config = await fetch("config.json").then((r) => r.json()).catch(() => ({}));
  $("token-field").hidden = config.auth_mode === "dev";
  // Which model answers, before the first message (none: chat answers 503).
  $("model").textContent = config.model
    ? `Answered by: ${config.model}`
    : "No model is configured: chat needs SANDBOX_WORKSPACE_LLM_MODEL and SANDBOX_WORKSPACE_LLM_BASE_URL.";
  $("user").value = api.user;
  $("token").value = api.token;
  await refreshSession();
  await loadConversations();
}

async function refreshSession() {
  try {
    const s = await api.call("GET", api.sessionUrl);
    $("session-status").textContent = `session ${s.session_id}: ${s.status}`;
  } catch (e) {
    $("session-status").textContent = e.status === 404 ? "no session yet (created on first upload or chat)" : e.message;
  }
}

// ---- conversations ----------------------------------------------------------------
let selections = 0; // a load that finishes after the user picked a conversation must not undo it

async function loadConversations() {
  const before = selections;
  const ids = new Set(store.get(`convs:${api.userId}`, []));
  try { // the server's list, where the API offers one
    const listed = await api.call("GET", `${api.sessionUrl}/conversations`);
    for (const c of listed.conversations || []) ids.add(c.conversation_id);
  } catch { /* no session yet, or no listing route */ }
  store.set(`convs:${api.userId}`, [...new Set([...store.get(`convs:${api.userId}`, []), ...ids])]);
  renderConversations();
  if (selections !== before) return;
  const last = store.get(`current:${api.userId}`, null);
  await selectConversation(ids.has(last) ? last : [...ids][0] || null);
}

// The list's buttons are made again only when the conversations change: a selection only
// moves the "current" mark, so a button is never replaced under a click in progress (a
// press on one button and a release on its replacement is no click at all).
function renderConversations() {
  const list = $("conversation-list");
  const ids = store.get(`convs:${api.userId}`, []);
  const shown = [...list.querySelectorAll("button")].map((b) => b.dataset.conversation);
  if (shown.length !== ids.length || shown.some((id, i) => id !== ids[i])) {
    list.replaceChildren();
    for (const id of ids) {
      const li = document.createElement("li");
      const button = document.createElement("button");
      button.textContent = id;
      button.dataset.conversation = id;
      button.addEventListener("click", () => selectConversation(id).catch(showError));
      li.append(button);
      list.append(li);
    }
  }
  for (const button of list.querySelectorAll("button")) {
    button.className = button.dataset.conversation === cid ? "current" : "";
  }
}

async function selectConversation(id) {
  selections += 1;
  cid = id;
  store.set(`current:${api.userId}`, id);
  $("current-conversation").textContent = id ? `in ${id}` : "(create a conversation first)";
  $("delete-conversation").disabled = !id;
  $("fork-conversation").disabled = !id;
  $("take-snapshot").disabled = !id;
  $("snapshot-status").textContent = "";
  renderConversations();
  await refreshUploads();
  await refreshSnapshots();
  await redrawTranscript();
}

$("new-conversation").addEventListener("submit", async (e) => {
  e.preventDefault();
  const id = $("conversation-name").value.trim() || `conv-${Date.now().toString(36)}`;
  const ids = store.get(`convs:${api.userId}`, []);
  if (!ids.includes(id)) store.set(`convs:${api.userId}`, [...ids, id]);
  $("conversation-name").value = "";
  await selectConversation(id).catch(showError);
});

$("delete-conversation").addEventListener("click", async () => {
  if (!cid) return;
  try {
    await api.call("DELETE", `${api.sessionUrl}/conversations/${encodeURIComponent(cid)}`);
  } catch (e) {
    if (e.status !== 404) return showError(e);
  }
  localStorage.removeItem(key("turns"));
  store.set(`convs:${api.userId}`, store.get(`convs:${api.userId}`, []).filter((c) => c !== cid));
  await selectConversation(store.get(`convs:${api.userId}`, [])[0] || null).catch(showError);
});

// ---- snapshots and forks (docs/api.md) ---------------------------------------------
const conversationUrl = (id) => `${api.sessionUrl}/conversations/${encodeURIComponent(id)}`;

async function refreshSnapshots() {
  const conversation = cid;
  let snapshots = [];
  if (conversation) {
    try {
      snapshots = (await api.call("GET", `${conversationUrl(conversation)}/snapshots`)).snapshots;
    } catch { /* nothing written yet: no snapshots */ }
  }
  if (conversation !== cid) return; // another conversation was picked meanwhile
  const items = snapshots.map((s) => {
    const li = document.createElement("li");
    li.dataset.snapshot = s.snapshot_id;
    li.textContent = `${s.name || s.created_at.slice(11, 19)} · ${s.file_count} files `;
    const restore = document.createElement("button");
    restore.textContent = "Restore";
    restore.className = "restore";
    restore.addEventListener("click", async () => {
      try {
        const url = `${conversationUrl(conversation)}/snapshots/${s.snapshot_id}/restore`;
        const done = await api.call("POST", url);
        $("snapshot-status").textContent = `restored "${done.name}"; Python restarted`;
        await refreshUploads();
      } catch (e) { showError(e); }
    });
    li.append(restore);
    return li;
  });
  $("snapshot-list").replaceChildren(...items);
}

$("take-snapshot").addEventListener("click", async () => {
  if (!cid) return;
  try {
    const name = new Date().toLocaleTimeString();
    await api.call("POST", `${conversationUrl(cid)}/snapshots`, { name });
    await refreshSnapshots();
  } catch (e) { showError(e); }
});

$("fork-conversation").addEventListener("click", async () => {
  if (!cid) return;
  try {
    const forked = await api.call("POST", `${conversationUrl(cid)}/fork`, {});
    const ids = store.get(`convs:${api.userId}`, []);
    store.set(`convs:${api.userId}`, [...ids, forked.conversation_id]);
    await selectConversation(forked.conversation_id);
  } catch (e) { showError(e); }
});

// ---- uploads ----------------------------------------------------------------------
// Refreshes overlap (an upload's own, a conversation switch, a session refresh): each one
// builds its rows off-page and only the newest one to finish its fetch replaces the table,
// so two refreshes never both append to it.
let uploadRefreshes = 0;

async function refreshUploads() {
  const body = $("uploads").tBodies[0];
  const mine = ++uploadRefreshes;
  const conversation = cid;
  let files = [];
  if (conversation) {
    try {
      const listing = await api.call("GET", `${api.sessionUrl}/files?conversation_id=${encodeURIComponent(conversation)}`);
      files = listing.items; // the files; listing.files holds their names (seed 000 §6.3)
    } catch (e) {
      if (e.status !== 404) showError(e);
    }
  }
  if (mine !== uploadRefreshes) return; // a newer refresh owns the table
  const rows = document.createElement("tbody");
  for (const f of files) {
    const row = rows.insertRow();
    row.dataset.name = f.name;
    const use = document.createElement("input");
    use.type = "checkbox";
    use.className = "select";
    use.checked = true;
    use.value = f.path;
    row.insertCell().append(use);
    row.insertCell().textContent = f.name;
    row.insertCell().textContent = formatSize(f.size);
    const when = new Date(f.uploaded_at);
    const time = row.insertCell();
    time.textContent = when.toLocaleString([], { dateStyle: "short", timeStyle: "short" });
    time.title = f.uploaded_at;
    const sha = row.insertCell();
    sha.textContent = `${f.sha256.slice(0, 8)}…`;
    sha.title = f.sha256;
    sha.className = "mono";
    const actions = row.insertCell();
    const download = document.createElement("button");
    download.textContent = "Download";
    download.className = "download";
    download.addEventListener("click", async () => {
      const a = document.createElement("a");
      a.href = await api.blobUrl(`${api.sessionUrl}/files/${encodeURIComponent(f.name)}?conversation_id=${encodeURIComponent(conversation)}`);
      a.download = f.name;
      document.body.append(a);
      a.click();
      a.remove();
    });
    const remove = document.createElement("button");
    remove.textContent = "Delete";
    remove.className = "delete danger";
    remove.addEventListener("click", async () => {
      try {
        await api.call("DELETE", `${api.sessionUrl}/files/${encodeURIComponent(f.name)}?conversation_id=${encodeURIComponent(conversation)}`);
      } catch (e) { showError(e); }
      await refreshUploads();
    });
    actions.append(download, remove);
  }
  body.replaceChildren(...rows.rows);
}

$("upload").addEventListener("submit", async (e) => {
  e.preventDefault();
  const file = $("file").files[0];
  if (!file || !cid) return showError(new Error(cid ? "choose a file first" : "create a conversation first"));
  const bar = $("upload-progress");
  bar.hidden = false;
  bar.value = 0;
  $("upload-status").textContent = `uploading ${file.name}…`;
  try {
    const done = await api.upload(cid, file, (p) => { bar.value = Math.round(p * 100); });
    bar.value = 100;
    $("upload-status").textContent = `uploaded ${done.name} to ${done.path}`;
    $("file").value = "";
  } catch (err) {
    $("upload-status").textContent = "";
    showError(err);
  }
  await refreshUploads();
  await refreshSession();
});

// ---- chat -------------------------------------------------------------------------
const hooks = {
  decide: (runId, callId, approved) =>
    api.call("POST", `/api/v1/runs/${runId}/approvals`, { tool_call_id: callId, approved })
      .catch(showError),
  fileUrl,
};

function saveTurn(turns, index, patch) {
  turns[index] = { ...turns[index], ...patch };
  store.set(key("turns"), turns);
}

async function follow(turn, events, turns, index) {
  const owner = cid;
  try {
    for await (const event of events) {
      if (cid !== owner) return; // the user switched conversations; the run goes on
      turn.apply(event);
      if (event.kind === "run_started") saveTurn(turns, index, { run: event.data.run_id });
      if (event.kind === "done") saveTurn(turns, index, { finished: true });
    }
  } catch (e) {
    if (e.status === 404 && turns[index].answer) { // the run is no longer kept: its answer is
      turn.apply({ id: 0, kind: "text", data: { delta: turns[index].answer } });
      return;
    }
    turn.apply({ id: 0, kind: "error", data: { message: e.message, code: "stream" } });
  }
}

async function redrawTranscript() {
  const transcript = $("transcript");
  transcript.replaceChildren();
  if (!cid) return;
  const turns = store.get(key("turns"), []);
  try { // runs this page does not know (another tab, another browser), where the API lists them
    const known = new Set(turns.map((t) => t.run));
    const listed = await api.call("GET", `${api.sessionUrl}/conversations/${encodeURIComponent(cid)}/runs`);
    for (const run of listed.runs || []) {
      if (!run.finished && !known.has(run.run_id)) turns.push({ query: "(a run started elsewhere)", run: run.run_id });
    }
  } catch { /* no session yet, or no listing route */ }
  turns.forEach((t, i) => { // each turn replays and, while its run goes on, follows it
    const turn = new Turn(transcript, t.query, hooks);
    if (t.run) follow(turn, api.events(`/api/v1/runs/${t.run}/events`), turns, i);
  });
}

$("ask").addEventListener("submit", async (e) => {
  e.preventDefault();
  const query = $("query").value.trim();
  if (!query || !cid) return showError(new Error(cid ? "type a question" : "create a conversation first"));
  $("query").value = "";
  const selected = [...document.querySelectorAll("#uploads input.select:checked")].map((i) => i.value);
  const turns = store.get(key("turns"), []);
  const history = turns.filter((t) => t.answer).flatMap((t) => [
    { role: "user", content: t.query }, { role: "assistant", content: t.answer }]);
  turns.push({ query });
  store.set(key("turns"), turns);
  const turn = new Turn($("transcript"), query, hooks);
  const body = JSON.stringify({ query, conversation_id: cid, selected_files: selected, history });
  await follow(turn, api.events("/api/v1/chat", {
    method: "POST", body, headers: { "Content-Type": "application/json" },
  }), turns, turns.length - 1);
  const answer = turn.node.querySelector(".text:last-of-type")?.textContent;
  if (answer) saveTurn(turns, turns.length - 1, { answer });
  await refreshSession();
});

$("query").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); }
});

$("identity").addEventListener("submit", async (e) => {
  e.preventDefault();
  api = new Api({ user: $("user").value, token: $("token").value });
  store.set("identity", { user: api.user });
  sessionStorage.setItem("token", api.token);
  await applyIdentity().catch(showError);
});

applyIdentity().catch(showError);
