// Seed 000 §6's frontend snippets, run against a live API (tests/api/test_seed_snippets.py).
//
// The functions below are the seed's TypeScript as written, with only the type
// annotations removed (Node runs JavaScript): same URLs, same FormData fields, same
// headers (the underscored `conversation_id`), same bare-name download. What a browser
// provides and Node does not (window.URL.createObjectURL, document, a File the user
// picked) is stubbed around them; `chatWithSandboxSession` is the seed's own helper that
// §6.2 calls but does not define (it answers the session id, §6.1).
//
// Usage: node snippets.mjs API_URL USER_ID CONVERSATION_ID — prints one JSON line.

import { File as BufferFile } from "node:buffer";

const [SANDBOX_API_URL, USER_ID, CONVERSATION_ID] = process.argv.slice(2);
const File = globalThis.File ?? BufferFile; // global from Node 20; node:buffer in 18

// --- browser stand-ins -------------------------------------------------------------------
const downloads = [];
globalThis.window = {
  URL: {
    createObjectURL: (blob) => {
      downloads.push(blob);
      return `blob:${downloads.length}`;
    },
    revokeObjectURL: () => {},
  },
};
globalThis.document = {
  createElement: () => ({ click() {} }),
  body: { appendChild() {}, removeChild() {} },
};

// --- seed 000 §6.1 -------------------------------------------------------------------------
function generateSessionId(userId) {
    return `sb-session-${userId}`;
}

async function uploadFileForUser(userId, conversationId, file) {
    const sessionId = generateSessionId(userId);

    const formData = new FormData();
    formData.append('file', file);
    formData.append('conversation_id', conversationId);
    formData.append('subdir', 'temparea');

    const response = await fetch(
        `${SANDBOX_API_URL}/api/v1/sessions/${sessionId}/files/upload`,
        {
            method: 'POST',
            body: formData,
        }
    );

    return response.json();
}

// --- seed 000 §6.2 -------------------------------------------------------------------------
async function uploadFile(options) {
  const { sandboxSessionId, conversationId, file } = options;
  const formData = new FormData();
  formData.append('file', file);
  formData.append('conversation_id', conversationId);
  formData.append('subdir', 'temparea'); // 指定子目录为 temparea

  const response = await fetch(
    `${SANDBOX_API_URL}/api/v1/sessions/${sandboxSessionId}/files/upload`,
    {
      method: 'POST',
      body: formData,
    }
  );

  if (!response.ok) {
    throw new Error(`Upload failed: ${response.statusText}`);
  }

  return response.json();
}

// --- seed 000 §6.3 -------------------------------------------------------------------------
async function listTempAreaFiles(options) {
  const { sandboxSessionId, conversationId } = options;

  const response = await fetch(
    `${SANDBOX_API_URL}/api/v1/sessions/${sandboxSessionId}/files`,
    {
      method: 'GET',
      headers: {
        'conversation_id': conversationId,
        'subdir': 'temparea', // 只列出 temparea 目录下的文件
      },
    }
  );

  if (!response.ok) {
    throw new Error(`List files failed: ${response.statusText}`);
  }

  const data = await response.json();
  return data.files; // ["data.csv", "model.pkl", ...]
}

// --- seed 000 §6.4 -------------------------------------------------------------------------
async function downloadFile(options) {
  const { sandboxSessionId, fileName } = options;

  const response = await fetch(
    `${SANDBOX_API_URL}/api/v1/sessions/${sandboxSessionId}/files/${fileName}`,
    {
      method: 'GET',
    }
  );

  if (!response.ok) {
    throw new Error(`Download failed: ${response.statusText}`);
  }

  const blob = await response.blob();
  const url = window.URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = fileName;
  document.body.appendChild(a);
  a.click();
  document.body.removeChild(a);
  window.URL.revokeObjectURL(url);
}

// --- the seed's usage examples, in order ---------------------------------------------------
async function chatWithSandboxSession(_agentId, _query) {
  return generateSessionId(USER_ID);
}

const first = await uploadFileForUser(USER_ID, CONVERSATION_ID, new File(["x,y\n1,2\n"], "model.csv"));

const sandboxSessionId = await chatWithSandboxSession('agent123', '上传一个文件分析');
const selectedFile = new File(["a,b\n3,4\n"], "data.csv", { type: "text/csv" });
const uploaded = await uploadFile({
  sandboxSessionId: sandboxSessionId,
  conversationId: CONVERSATION_ID,
  file: selectedFile,
});

const files = await listTempAreaFiles({
  sandboxSessionId: sandboxSessionId,
  conversationId: CONVERSATION_ID,
});

await downloadFile({
  sandboxSessionId: sandboxSessionId,
  fileName: 'data.csv',
});

console.log(JSON.stringify({
  first,
  uploaded,
  listed: [...files].sort(), // the seed's names, as listTempAreaFiles answers them
  downloaded: await downloads[0].text(),
}));
