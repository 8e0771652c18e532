#!/usr/bin/env bash
# Installs the pinned npm packages of the client tests (tests/clients: the Vercel AI SDK
# `ai` and `@ag-ui/client`; `@hey-api/openapi-ts` and `typescript`, which generate and
# compile the TypeScript client of tests/clients/test_generated_clients.py; E2B's JS SDK
# `e2b` and `@e2b/code-interpreter` of tests/clients/test_e2b_js_sdk.py) from their lockfile
# with `npm ci`, when node and npm exist.
# Skipped when the lockfile has not changed since the last install. Without node/npm it
# only says so; tests/clients/test_clients.py then skips with that reason.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/clients"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "note: node/npm not installed; the AI SDK and AG-UI client tests will skip"
  exit 0
fi
stamp="$dir/node_modules/.package-lock.json"
if [ -f "$stamp" ] && [ "$stamp" -nt "$dir/package-lock.json" ]; then
  exit 0
fi
echo "installing the client tests' npm packages (npm ci in tests/clients)"
npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
