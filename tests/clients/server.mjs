// What both client suites need of the server under test: its URL, the test's user, and
// an upload through the plain HTTP API (the chat clients have no upload of their own).
import assert from "node:assert/strict";

export const base = process.env.SANDBOX_API_URL;
export const user = process.env.SANDBOX_TEST_USER;
export const headers = { "X-User-Id": user };

// Uploads `text` as `name` into the conversation; returns the file's real sandbox path.
export async function upload(conversationId, name, text) {
  const form = new FormData();
  form.append("conversation_id", conversationId);
  form.append("file", new Blob([text]), name);
  const response = await fetch(`${base}/api/v1/sessions/sb-session-${user}/files/upload`, { method: "POST", headers, body: form });
  assert.equal(response.status, 201, await response.clone().text());
  return (await response.json()).path;
}
