// What both client suites need of the server under test: its URL, the test's user, and
// an upload through the plain HTTP API (the chat clients have no upload of their own).
//
// With SANDBOX_API_URL_B set (two API replicas sharing a run store), every request that
// carries a turn on — an approval answered, an interrupt resumed, a stream resumed — goes
// to replica B, everything else (uploads, turns that start a run) to A: the clients'
// whole conversations cross replicas the way a load balancer may send them.
import assert from "node:assert/strict";
import { after } from "node:test";

export const base = process.env.SANDBOX_API_URL;
export const user = process.env.SANDBOX_TEST_USER;
export const headers = { "X-User-Id": user };

const replicaB = process.env.SANDBOX_API_URL_B;
if (replicaB) {
  const fetchA = globalThis.fetch;
  let onB = 0;
  const continues = (path, init) => {
    if (/^\/api\/v1\/ui\/chat\/[^/]+\/stream$/.test(path)) return true;
    if (init?.method !== "POST" || typeof init.body !== "string") return false;
    const body = JSON.parse(init.body);
    if (path === "/api/v1/ag-ui") return Boolean(body.resume?.length);
    return path === "/api/v1/ui/chat" && body.messages?.at(-1)?.role === "assistant";
  };
  globalThis.fetch = (url, init) => {
    const target = String(url);
    if (target.startsWith(base) && continues(new URL(target).pathname, init)) {
      onB += 1;
      return fetchA(replicaB + target.slice(base.length), init);
    }
    return fetchA(url, init);
  };
  after(() => {
    console.log(`# replica B answered ${onB} continuations`);
    assert.ok(onB > 0, "no request went to replica B");
  });
}

// Uploads `text` as `name` into the conversation; returns the file's real sandbox path.
export async function upload(conversationId, name, text) {
  const form = new FormData();
  form.append("conversation_id", conversationId);
  form.append("file", new Blob([text]), name);
  const response = await fetch(`${base}/api/v1/sessions/sb-session-${user}/files/upload`, { method: "POST", headers, body: form });
  assert.equal(response.status, 201, await response.clone().text());
  return (await response.json()).path;
}
