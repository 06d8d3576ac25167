#!/usr/bin/env bash
# The test set-up and run: Debian's chromium for the report's browser check (when missing and root),
# the package with its test extras, the import-layering contracts, the type check, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the browser check will be skipped" >&2
fi
pip install -q -e ".[test]"
lint-imports --no-cache   # the layering contracts in pyproject.toml
mypy                      # the type check in pyproject.toml: ir, planner (strict), simulator, the CLI
python -m pytest "$@"
