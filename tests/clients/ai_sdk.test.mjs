// The Vercel AI SDK (`ai`, pinned in package-lock.json) against /api/v1/ui/chat.
// Run by test_clients.py with SANDBOX_API_URL and SANDBOX_TEST_USER set; the scripted
// model answers by query (tests/support/ui_script.py).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from "ai";
import { base, headers, upload } from "./server.mjs";

// What the transport saw of each response (status, protocol header).
const seen = [];
async function recordingFetch(url, init) {
  const response = await fetch(url, init);
  seen.push({ url: String(url), status: response.status, protocol: response.headers.get("x-vercel-ai-ui-message-stream") });
  return response;
}

function transport(conversationId, extra = {}) {
  return new DefaultChatTransport({
    api: `${base}/api/v1/ui/chat`,
    headers,
    body: { conversation_id: conversationId, selected_files: [] },
    fetch: recordingFetch,
    ...extra,
  });
}

const userMessage = (text) => ({ id: randomUUID(), role: "user", parts: [{ type: "text", text }] });
const textOf = (message) => message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

async function lastSnapshot(stream) {
  let last;
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) last = message;
  return last;
}

// A Chat as useChat keeps it, minus React: the SDK's own state machine over plain arrays.
class NodeChatState {
  constructor() { this.messages = []; this.status = "ready"; this.error = undefined; }
  pushMessage = (m) => { this.messages = this.messages.concat(m); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), this.snapshot(m), ...this.messages.slice(i + 1)]; };
  snapshot = (thing) => structuredClone(thing);
}
class Chat extends AbstractChat {
  constructor(init) { super({ ...init, state: new NodeChatState() }); }
}

async function until(what, condition, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test("plain text arrives as a text part of one assistant message", async () => {
  const stream = await transport("ai-text").sendMessages({
    chatId: "chat-text", messages: [userMessage("say hello")], trigger: "submit-message",
    messageId: undefined, abortSignal: undefined,
  });
  const message = await lastSnapshot(stream);
  assert.equal(message.role, "assistant");
  assert.equal(textOf(message), "Hello from the sandbox");
  assert.match(message.id, /^msg_run_/);
  assert.equal(message.metadata.conversation_id, "ai-text");
  assert.deepEqual(seen.at(-1), { url: `${base}/api/v1/ui/chat`, status: 200, protocol: "v1" });
});

test("a tool call reads the uploaded file at its real path", async () => {
  const path = await upload("ai-files", "sales.csv", "month,sales\nMar,42\n");
  assert.match(path, /\/ai-files\/uploads\/temparea\/sales\.csv$/);

  const stream = await transport("ai-files").sendMessages({
    chatId: "chat-files", messages: [userMessage(`read ${path}`)], trigger: "submit-message",
    messageId: undefined, abortSignal: undefined,
  });
  const message = await lastSnapshot(stream);
  const tool = message.parts.find((p) => p.type === "tool-read_file");
  assert.ok(tool, JSON.stringify(message.parts));
  assert.equal(tool.state, "output-available");
  assert.deepEqual(tool.input, { path });
  assert.match(tool.output.output, /Mar,42/);
  assert.match(textOf(message), /The file says: month,sales/);
});

for (const approved of [true, false]) {
  test(`an approval ${approved ? "granted" : "rejected"} through the chat's approval response`, async () => {
    const chat = new Chat({
      id: `chat-approval-${approved}`,
      transport: transport(`ai-approval-${approved}`),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    });
    await chat.sendMessage({ text: "run bash" });
    const asked = chat.messages.at(-1).parts.find((p) => p.type === "tool-bash");
    assert.equal(asked.state, "approval-requested");
    assert.deepEqual(asked.input, { command: "echo approved-ran" });
    assert.match(asked.approval.id, /^run_[0-9a-f]+:call_bash$/);

    // The SDK sends the next request by itself once every approval has an answer.
    await chat.addToolApprovalResponse({ id: asked.approval.id, approved, reason: approved ? undefined : "not now" });
    await until("the continuation", () => chat.status === "ready" && /bash said/.test(textOf(chat.messages.at(-1))));

    assert.equal(chat.messages.length, 2, "the continuation streams into the same assistant message");
    const message = chat.messages.at(-1);
    const tool = message.parts.find((p) => p.type === "tool-bash");
    if (approved) {
      assert.equal(tool.state, "output-available");
      assert.match(tool.output.output, /approved-ran/);
      assert.match(textOf(message), /bash said: .*approved-ran/s);
    } else {
      assert.equal(tool.state, "output-denied");
      assert.match(textOf(message), /bash said: The user rejected this tool call \(not now\)/);
    }
    assert.equal(chat.error, undefined);
  });
}

test("a reload while an approval waits shows it again, and answering it continues the run", async () => {
  const id = "chat-reload";
  const before = new Chat({ id, transport: transport("ai-reload") });
  await before.sendMessage({ text: "run bash" });
  assert.equal(before.messages.at(-1).parts.find((p) => p.type === "tool-bash").state, "approval-requested");

  // A new page: no messages in memory, only the chat id; useChat({resume: true}) resumes.
  const after = new Chat({
    id,
    transport: transport("ai-reload"),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  await after.resumeStream();
  await until("the replay", () => after.status === "ready" && after.messages.length === 1);
  const asked = after.messages[0].parts.find((p) => p.type === "tool-bash");
  assert.equal(asked.state, "approval-requested");
  assert.equal(after.messages[0].id, before.messages.at(-1).id);

  await after.addToolApprovalResponse({ id: asked.approval.id, approved: true });
  await until("the continuation", () => after.status === "ready" && /bash said/.test(textOf(after.messages.at(-1))));
  assert.equal(after.messages[0].parts.find((p) => p.type === "tool-bash").state, "output-available");
});

test("a stream resumes after the connection dropped", async () => {
  // The first response's body breaks after its first bytes, as a dropped connection does.
  let dropped = false;
  const droppingFetch = async (url, init) => {
    const response = await recordingFetch(url, init);
    if (init?.method !== "POST" || dropped) return response;
    dropped = true;
    const reader = response.body.getReader();
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        controller.enqueue(value);
        if (new TextDecoder().decode(value).includes("text-delta")) {
          await reader.cancel();
          controller.error(new TypeError("network connection lost"));
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
  const chat = new Chat({ id: "chat-resume", transport: transport("ai-resume", { fetch: droppingFetch }) });
  await chat.sendMessage({ text: "count slowly" });
  assert.ok(dropped);
  const partial = textOf(chat.messages.at(-1));
  assert.ok(partial.length < 60, `the drop came mid-answer, got ${partial.length} chars`);

  await chat.resumeStream();
  await until("the resumed answer", () => chat.status === "ready");
  const expected = Array.from({ length: 30 }, (_, i) => `w${i} `).join("");
  assert.equal(textOf(chat.messages.at(-1)), expected);
  assert.equal(chat.messages.length, 2, "the replay replaced the partial message");
  const resume = seen.filter((s) => s.url.endsWith("/api/v1/ui/chat/chat-resume/stream"));
  assert.deepEqual(resume.map((s) => [s.status, s.protocol]), [[200, "v1"]]);

  // Once the run has finished there is nothing to resume: 204.
  const again = await fetch(`${base}/api/v1/ui/chat/chat-resume/stream`, { headers });
  assert.equal(again.status, 204);
});

test("a run that fails reaches the chat as its error", async () => {
  const reported = [];
  const chat = new Chat({ id: "chat-error", transport: transport("ai-error"), onError: (e) => reported.push(e) });
  await chat.sendMessage({ text: "break the model" });
  assert.equal(chat.status, "error");
  assert.match(chat.error.message, /the model endpoint answered 400.*\(llm_http_error\)$/s);
  assert.deepEqual(reported, [chat.error]);
});

test("keep-alive comments while the model is silent do not disturb the stream", async () => {
  let raw = "";
  let drained;
  const teeFetch = async (url, init) => {
    const response = await fetch(url, init);
    const [mine, theirs] = response.body.tee();
    drained = (async () => { for await (const b of mine) raw += new TextDecoder().decode(b); })();
    return new Response(theirs, { status: response.status, headers: response.headers });
  };
  const stream = await transport("ai-quiet", { fetch: teeFetch }).sendMessages({
    chatId: "chat-quiet", messages: [userMessage("think first")], trigger: "submit-message",
    messageId: undefined, abortSignal: undefined,
  });
  const message = await lastSnapshot(stream);
  assert.equal(textOf(message), "Thought it through");
  await drained;
  assert.match(raw, /^: keep-alive$/m);
  assert.match(raw, /data: \[DONE\]\n\n$/);
});
