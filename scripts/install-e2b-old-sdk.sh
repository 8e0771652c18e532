#!/usr/bin/env bash
# Installs the older E2B Python SDK of tests/api/test_e2b_old_sdk.py (e2b 2.50.0, from
# before the /v2/sandboxes routes, and its code interpreter) from the pins of
# tests/api/e2b-sdk-old.txt into .cache/e2b-sdk-old — a target directory apart from the
# .venv, which has the newest SDK; the test puts it first on PYTHONPATH. Skipped when
# the pins have not changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pins="$root/tests/api/e2b-sdk-old.txt"
target="$root/.cache/e2b-sdk-old"
stamp="$target/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt "$pins" ]; then
  exit 0
fi
echo "installing the older E2B SDK of tests/api/test_e2b_old_sdk.py into .cache/e2b-sdk-old"
rm -rf "$target"
"$root/.venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
  --target "$target" -r "$pins"
touch "$stamp"
