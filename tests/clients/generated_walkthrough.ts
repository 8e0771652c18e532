// The README's walk-through through the TypeScript client @hey-api/openapi-ts generated
// from the server's /openapi.json (tests/clients/test_generated_clients.py generates it
// into ./gen next to this file, compiles both with tsc --strict, and runs the result).
// Compiling is half the test: a call whose parameters the contract does not describe
// fails there. The user goes as the `userId` security scheme (X-User-Id), through the
// client's own auth option rather than a hand-written header.
import { createClient } from "./gen/client";
import * as api from "./gen";

declare const process: { env: Record<string, string | undefined>; exitCode?: number };

function check(condition: unknown, what: string, detail?: unknown): asserts condition {
  if (!condition) throw new Error(`${what}: ${JSON.stringify(detail)}`);
}

async function main(): Promise<void> {
  const user = process.env.SANDBOX_TEST_USER ?? "ts-client";
  const client = createClient({ baseUrl: process.env.SANDBOX_API_URL, auth: () => user });
  const session_id = `sb-session-${user}`;
  const conversation_id = "conv-ts";

  const created = await api.createSession({ client, body: { user_id: user } });
  check(created.response.status === 201, "create_session", created.error);

  const csv = "city,temp\nParis,15\nOslo,5\n";
  const uploaded = await api.uploadFile({
    client,
    path: { session_id },
    body: { file: new File([csv], "weather.csv"), conversation_id, subdir: "temparea" },
  });
  check(uploaded.data?.path.endsWith("/uploads/temparea/weather.csv"), "upload_file", uploaded);

  const listed = await api.listFiles({
    client,
    path: { session_id },
    headers: { conversation_id, subdir: "temparea" },
  });
  check(listed.data && "files" in listed.data, "list_files", listed.error);
  check(JSON.stringify(listed.data.files) === '["weather.csv"]', "list_files", listed.data);

  const downloaded = await api.downloadFile({
    client,
    path: { session_id, name: "weather.csv" },
    query: { conversation_id },
    parseAs: "blob",
  });
  check((await downloaded.data?.text()) === csv, "download_file", downloaded.error);

  const ran = await api.execute({
    client,
    path: { session_id },
    body: {
      language: "python",
      conversation_id,
      code: "import pandas as pd\nprint(pd.read_csv('uploads/temparea/weather.csv').temp.mean())",
    },
  });
  check(ran.data?.exit_code === 0 && ran.data.stdout.trim() === "10.0", "execute", ran.data);

  const deleted = await api.deleteFile({
    client,
    path: { session_id, name: "weather.csv" },
    query: { conversation_id },
  });
  check(deleted.response.status === 200, "delete_file", deleted.error);
  const after = await api.listFiles({ client, path: { session_id }, query: { conversation_id } });
  check(after.data && "files" in after.data && after.data.files.length === 0, "list", after.data);

  const gone = await api.deleteSession({ client, path: { session_id } });
  check(gone.response.status === 200, "delete_session", gone.error);
  console.log("walk-through ok");
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
