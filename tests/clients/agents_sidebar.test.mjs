// Seed 002's chat sidebar, moved onto /api/v1/agents: the stream consumed exactly as the
// seed describes ChatSidebar.tsx consuming /api/agent — plain fetch, no SDK:
// `text` appended to the assistant message, `tool_start`/`tool_end` as message parts,
// `result.updatedData` handed to onDataUpdate, `error` appended to the message, and at
// the end the message no longer streaming with unfinished tool parts completed.
// Environment: SANDBOX_API_URL, SANDBOX_TEST_USER, AGENTS_TABLE_ID, AGENTS_EXPECTED
// (the table as the agent should leave it), AGENTS_ANSWER (the model's answer).
import assert from "node:assert/strict";
import { test } from "node:test";

const base = process.env.SANDBOX_API_URL;
const headers = { "Content-Type": "application/json", "X-User-Id": process.env.SANDBOX_TEST_USER };

// The sidebar's reader: SSE frames split on blank lines, each `data:` line one JSON event.
async function sendToAgent(body, message, onDataUpdate) {
  const response = await fetch(`${base}/api/v1/agents`, { method: "POST", headers, body: JSON.stringify(body) });
  assert.equal(response.status, 200, await response.clone().text());
  assert.match(response.headers.get("content-type"), /^text\/event-stream/);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const seen = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const event = JSON.parse(line.slice(6));
        seen.push(event.type);
        switch (event.type) {
          case "text":
            message.content += event.content;
            break;
          case "tool_start":
            message.parts.push({ type: "tool", id: event.id, name: event.name, input: event.input, state: "running" });
            break;
          case "tool_end": {
            const part = message.parts.find((p) => p.id === event.id);
            Object.assign(part, { output: event.output, state: event.success ? "done" : "error" });
            break;
          }
          case "result":
            if (event.updatedData !== undefined && event.updatedData !== null) onDataUpdate(event.updatedData);
            break;
          case "error":
            message.content += `\n\n⚠️ ${event.error}`;
            break;
          case "status":
            message.status = event.message;
            break;
          default:
            assert.fail(`an event the sidebar does not know: ${event.type}`);
        }
      }
    }
  }
  message.streaming = false;
  for (const part of message.parts) if (part.state === "running") part.state = "done";
  return seen;
}

test("the sidebar edits the table through /api/v1/agents", async () => {
  const message = { role: "assistant", content: "", parts: [], streaming: true };
  let tableData = null;
  const seen = await sendToAgent(
    {
      prompt: "Double every age",
      chatHistory: [{ role: "user", content: "hello" }, { role: "assistant", content: "Hi!" }],
      table_id: Number(process.env.AGENTS_TABLE_ID),
      workingDirectory: "",
      bashAccessPoints: [{ path: "/", mode: "full" }],
    },
    message,
    (updated) => { tableData = updated; },
  );
  assert.equal(seen.at(-1), "result");
  assert.ok(new Set(seen).size >= 5, seen.join(","));
  assert.equal(message.content, process.env.AGENTS_ANSWER);
  assert.equal(message.streaming, false);
  assert.equal(message.parts.length, 1);
  const [tool] = message.parts;
  assert.equal(tool.name, "bash");
  assert.equal(tool.state, "done");
  assert.match(tool.input.command, /data\.json/);
  assert.match(tool.output, /users updated/);
  assert.deepEqual(tableData, JSON.parse(process.env.AGENTS_EXPECTED));
});

test("an unknown table is refused before any stream, and nothing is updated", async () => {
  const message = { role: "assistant", content: "", parts: [], streaming: true };
  let updates = 0;
  const seen = await sendToAgent(
    { prompt: "Double every age", table_id: 999999, bashAccessPoints: [] },
    message,
    () => { updates += 1; },
  ).catch((e) => e);
  // An unknown table is refused before any stream: the sidebar sees the HTTP error.
  assert.ok(seen instanceof Error && /table_not_found/.test(seen.message), String(seen));
  assert.equal(seen.actual, 404);
  assert.equal(updates, 0);
});
