// @ag-ui/client's HttpAgent (pinned in package-lock.json) against /api/v1/ag-ui. The
// client verifies the event sequence itself (RUN_STARTED first, no RUN_FINISHED while a
// message or tool call is open, ...), so a run that completes here is a valid AG-UI run.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { HttpAgent } from "@ag-ui/client";
import { base, headers, upload } from "./server.mjs";

function agent(threadId) {
  const a = new HttpAgent({ url: `${base}/api/v1/ag-ui`, headers, threadId });
  a.seen = [];
  a.subscribe({ onEvent: ({ event }) => { a.seen.push(event); } });
  return a;
}

const ask = (a, text) => a.addMessage({ id: randomUUID(), role: "user", content: text });
const types = (a) => a.seen.map((e) => e.type);
const assistantText = (a) => a.messages.filter((m) => m.role === "assistant" && m.content).map((m) => m.content).join("");

test("plain text: RUN_STARTED, one text message, RUN_FINISHED (success)", async () => {
  const a = agent("agui-text");
  ask(a, "say hello");
  const { result } = await a.runAgent();
  const sequence = types(a).filter((t, i, all) => t !== "CUSTOM" && t !== all[i - 1]);
  assert.deepEqual(sequence, [
    "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED",
  ]);
  assert.equal(assistantText(a), "Hello from the sandbox");
  assert.equal(result.answer, "Hello from the sandbox");
  assert.equal(a.seen.at(-1).outcome.type, "success");
  assert.equal(a.seen[0].threadId, "agui-text");
});

test("a tool call reads the uploaded file at its real path (conversation in forwardedProps)", async () => {
  const path = await upload("agui-files", "weather.csv", "city,temp\nOslo,3\n");

  const a = agent(`client-thread-${randomUUID()}`); // the client's own thread id
  ask(a, `read ${path}`);
  await a.runAgent({ forwardedProps: { conversation_id: "agui-files", selected_files: ["weather.csv"] } });
  const sequence = types(a).filter((t) => t.startsWith("TOOL_CALL"));
  assert.deepEqual(sequence, ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]);
  const call = a.messages.flatMap((m) => m.toolCalls || []).find((c) => c.function.name === "read_file");
  assert.deepEqual(JSON.parse(call.function.arguments), { path });
  const result = a.messages.find((m) => m.role === "tool" && m.toolCallId === call.id);
  assert.match(result.content, /Oslo,3/);
  assert.match(assistantText(a), /The file says: city,temp/);
});

for (const approved of [true, false]) {
  test(`an approval ${approved ? "granted" : "rejected"}: interrupt, then a resumed run`, async () => {
    const a = agent(`agui-approval-${approved}`);
    ask(a, "run bash");
    await a.runAgent();
    const finished = a.seen.at(-1);
    assert.equal(finished.type, "RUN_FINISHED");
    assert.equal(finished.outcome.type, "interrupt");
    const [interrupt] = finished.outcome.interrupts;
    assert.equal(interrupt.reason, "tool_approval");
    assert.equal(interrupt.toolCallId, "call_bash");
    assert.deepEqual(a.pendingInterrupts.map((i) => i.id), [interrupt.id]);

    // The client refuses a new run that leaves the interrupt unanswered...
    await assert.rejects(a.runAgent(), /pending interrupt/);
    // ...and the next run answers it and continues the same engine run.
    a.seen = [];
    const resume = approved
      ? { interruptId: interrupt.id, status: "resolved", payload: { approved: true } }
      : { interruptId: interrupt.id, status: "cancelled" };
    const { result } = await a.runAgent({ resume: [resume] });
    assert.equal(a.seen[0].type, "RUN_STARTED");
    assert.equal(a.seen.at(-1).outcome.type, "success");
    const toolResult = a.seen.find((e) => e.type === "TOOL_CALL_RESULT");
    assert.equal(toolResult.toolCallId, "call_bash");
    if (approved) {
      assert.match(toolResult.content, /approved-ran/);
      assert.match(result.answer, /bash said: approved-ran/);
    } else {
      assert.match(toolResult.content, /^rejected: cancelled by the user/);
      assert.match(result.answer, /bash said: The user rejected this tool call/);
    }
    assert.deepEqual(a.pendingInterrupts, []);
  });
}

test("keep-alive comments while the model is silent are skipped by the client", async () => {
  let comments = 0;
  let drained;
  const countingFetch = async (url, init) => {
    const response = await fetch(url, init);
    const [mine, theirs] = response.body.tee();
    drained = (async () => {
      for await (const b of mine) comments += (new TextDecoder().decode(b).match(/^: keep-alive$/gm) || []).length;
    })();
    return new Response(theirs, { status: response.status, headers: response.headers });
  };
  const a = new HttpAgent({ url: `${base}/api/v1/ag-ui`, headers, threadId: "agui-quiet", fetch: countingFetch });
  ask(a, "think first");
  const { result } = await a.runAgent();
  assert.equal(result.answer, "Thought it through");
  await drained;
  assert.ok(comments >= 1, "a keep-alive went out while the model was silent");
});

test("a run that fails ends with RUN_ERROR, which the agent's subscribers get", async () => {
  const a = agent("agui-error");
  const errors = [];
  a.subscribe({ onRunErrorEvent: ({ event }) => { errors.push(event); } });
  ask(a, "break the model");
  await a.runAgent();
  assert.deepEqual(types(a).filter((t) => t !== "CUSTOM"), ["RUN_STARTED", "RUN_ERROR"]);
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, "llm_http_error");
  assert.match(errors[0].message, /the model endpoint answered 400/);
});

test("a resume the API did not issue is refused with a clear error", async () => {
  const a = agent("agui-bad-resume");
  ask(a, "hi");
  await assert.rejects(
    a.runAgent({ resume: [{ interruptId: "nonsense", status: "resolved", payload: { approved: true } }] }),
    (error) => error.status === 400 && /approval id 'nonsense' is not one this API issued/.test(JSON.stringify(error.payload)),
  );
});
