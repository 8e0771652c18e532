// The page's client of the public API: identity headers, JSON calls, uploads with
// progress, authenticated downloads, and the chat's SSE stream read with fetch (an
// EventSource cannot send the identity headers).

export class Api {
  constructor({ user = "", token = "" } = {}) {
    this.user = user.trim();
    this.token = token.trim();
  }

  // The session id is sb-session-{user}: the user is X-User-Id, or a JWT's subject.
  get userId() {
    if (this.user) return this.user;
    const parts = this.token.split(".");
    if (parts.length === 3) {
      try {
        return JSON.parse(atob(parts[1].replace(/-/g, "+").replace(/_/g, "/"))).sub || "dev";
      } catch { /* not a JWT */ }
    }
    return "dev";
  }

  get sessionUrl() {
    return `/api/v1/sessions/${encodeURIComponent(`sb-session-${this.userId}`)}`;
  }

  headers(extra = {}) {
    const h = { ...extra };
    if (this.user) h["X-User-Id"] = this.user;
    if (this.token) h.Authorization = `Bearer ${this.token}`;
    return h;
  }

  async call(method, path, body) {
    const init = { method, headers: this.headers() };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (!response.ok) throw await apiError(response);
    return response.status === 204 ? null : response.json();
  }

  upload(cid, file, onProgress) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("POST", `${this.sessionUrl}/files/upload`);
      for (const [k, v] of Object.entries(this.headers())) xhr.setRequestHeader(k, v);
      xhr.upload.onprogress = (e) => e.lengthComputable && onProgress(e.loaded / e.total);
      xhr.onload = () => {
        let body = {};
        try { body = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
        if (xhr.status === 201) resolve(body);
        else reject(new Error(body.error?.message || `upload failed (${xhr.status})`));
      };
      xhr.onerror = () => reject(new Error("upload failed: network error"));
      const form = new FormData();
      form.append("conversation_id", cid);
      form.append("file", file);
      xhr.send(form);
    });
  }

  // A file as a blob URL: downloads need the identity headers, which links cannot send.
  async blobUrl(url) {
    const response = await fetch(url, { headers: this.headers() });
    if (!response.ok) throw await apiError(response);
    return URL.createObjectURL(await response.blob());
  }

  // Yields {id, kind, data} for each SSE event of a native chat stream.
  async *events(path, init = {}) {
    const response = await fetch(path, { ...init, headers: this.headers(init.headers || {}) });
    if (!response.ok) throw await apiError(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const event = { id: 0, kind: "message", data: null };
        for (const line of frame.split("\n")) {
          if (line.startsWith("id: ")) event.id = Number(line.slice(4));
          else if (line.startsWith("event: ")) event.kind = line.slice(7);
          else if (line.startsWith("data: ")) event.data = JSON.parse(line.slice(6));
        }
        if (event.data !== null) yield event;
      }
    }
  }
}

async function apiError(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body.error?.message) message = body.error.message;
  } catch { /* not JSON */ }
  const error = new Error(message);
  error.status = response.status;
  return error;
}

export function formatSize(bytes) {
  const units = ["B", "KB", "MB", "GB"];
  let n = bytes;
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
