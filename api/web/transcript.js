// Renders one run's native chat events (run_started, status, text, tool_approval,
// tool_start, tool_end, result, error, done) as a turn of the transcript. Rendering is
// idempotent per event id, so a replay after a reload draws the same turn.

const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
};

export class Turn {
  // hooks: {decide(runId, callId, approved), fileUrl(url) -> Promise<blob URL>}
  constructor(container, query, hooks) {
    this.hooks = hooks;
    this.seen = 0;
    this.text = null;
    this.tools = new Map();
    this.node = el("div", { class: "turn" },
      el("div", { class: "user" }, query || ""),
      (this.body = el("div", { class: "assistant" })),
      (this.status = el("div", { class: "status muted" })));
    container.append(this.node);
  }

  apply(event) {
    if (event.id && event.id <= this.seen) return; // already drawn
    this.seen = event.id || this.seen;
    const scroller = this.node.parentElement;
    const atBottom = scroller && scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
    this.draw(event);
    if (atBottom) scroller.scrollTop = scroller.scrollHeight; // follow the stream
  }

  draw(event) {
    const d = event.data;
    switch (event.kind) {
      case "run_started": this.runId = d.run_id; this.node.dataset.run = d.run_id; break;
      case "status": this.status.textContent = d.message || d.stage || ""; break;
      case "text":
        if (!this.text) this.body.append((this.text = el("div", { class: "text" })));
        this.text.textContent += d.delta;
        break;
      case "tool_approval":
        this.tool(d).askApproval(d);
        this.status.textContent = `waiting for your decision on ${d.name}`;
        break;
      case "tool_start": this.tool(d).running(); break;
      case "tool_end": this.tool(d).ended(d); break;
      case "result": this.result(d); break;
      case "error":
        this.text = null;
        this.body.append(el("div", { class: "error" }, `${d.message} (${d.code})`));
        break;
      case "done": this.status.textContent = ""; this.node.classList.add("done"); break;
      default: break;
    }
  }

  tool(d) {
    this.text = null; // text after a tool step starts a new block
    let step = this.tools.get(d.tool_call_id);
    if (!step) {
      step = new ToolStep(d, this);
      this.tools.set(d.tool_call_id, step);
      this.body.append(step.node);
    }
    return step;
  }

  result(d) {
    this.text = null;
    const presented = d.presented || [];
    if (!presented.length) return;
    const box = el("div", { class: "outputs" }, el("h3", {}, "Outputs"));
    for (const file of presented) {
      const item = el("div", { class: "output" });
      const link = el("a", { href: "#", class: "download", "data-name": file.name }, `Download ${file.name}`);
      link.addEventListener("click", async (e) => {
        e.preventDefault();
        const url = await this.hooks.fileUrl(file.download_url);
        const a = el("a", { href: url, download: file.name });
        document.body.append(a);
        a.click();
        a.remove();
      });
      if (/\.(png|jpe?g|gif|svg|webp)$/i.test(file.name)) {
        const img = el("img", { alt: file.name, class: "inline-image" });
        img.addEventListener("load", () => {
          const scroller = this.node.parentElement;
          if (scroller) scroller.scrollTop = scroller.scrollHeight;
        });
        this.hooks.fileUrl(file.download_url).then((url) => { img.src = url; });
        item.append(img);
      }
      item.append(link);
      box.append(item);
    }
    this.body.append(box);
  }
}

class ToolStep {
  constructor(d, turn) {
    this.turn = turn;
    this.callId = d.tool_call_id;
    this.node = el("details", { class: "tool", open: "", "data-call": d.tool_call_id },
      el("summary", {}, el("span", { class: "tool-name" }, d.name), " ",
        (this.badge = el("span", { class: "badge" }, "…"))),
      d.arguments ? el("pre", { class: "args" }, pretty(d.arguments)) : null,
      (this.actions = el("div", { class: "actions" })),
      (this.output = el("pre", { class: "output-text" })));
  }

  askApproval() {
    this.badge.textContent = "waiting for approval";
    this.node.classList.add("approval");
    const decide = (approved) => async () => {
      this.actions.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      await this.turn.hooks.decide(this.turn.runId, this.callId, approved);
    };
    this.actions.replaceChildren(
      el("button", { class: "approve", onclick: decide(true) }, "Approve"),
      el("button", { class: "reject danger", onclick: decide(false) }, "Reject"));
  }

  running() {
    this.actions.replaceChildren();
    this.node.classList.remove("approval");
    this.badge.textContent = "running";
  }

  ended(d) {
    this.actions.replaceChildren();
    this.node.classList.remove("approval");
    this.badge.textContent = d.ok ? "done" : d.decision || "failed";
    this.node.classList.add(d.ok ? "ok" : "failed");
    this.output.textContent = d.output || "";
    if (d.ok) this.node.open = false; // a finished step folds away; failures stay open
  }
}

// Code and commands read best as themselves, not as JSON-escaped strings.
function pretty(args) {
  try {
    const parsed = JSON.parse(args);
    const keys = Object.keys(parsed);
    if (keys.length === 1 && typeof parsed[keys[0]] === "string") return parsed[keys[0]].trim();
    return JSON.stringify(parsed, null, 2);
  } catch { return args; }
}
