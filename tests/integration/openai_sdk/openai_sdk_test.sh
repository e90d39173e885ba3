#!/bin/bash
# The official OpenAI SDK for Node.js against the coordinator's HTTP front:
# finds the npm packages tools/bootstrap.sh installed, starts one
# `mneme cluster up --tp 2`, then runs every *.test.mjs beside this script
# (suite.mjs, node:test) against it. Fails, never skips, when node or the
# packages are missing.
#
# The packages are looked for in $MNEME_NODE_DIR (.bazelrc's --test_env
# passes it on when set), else in ~/.cache/mneme/node, bootstrap's default.
set -uo pipefail

fail() {
  echo "openai_sdk_test: FAIL: $*" >&2
  exit 1
}

runfiles="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-mneme}"
here="$runfiles/tests/integration/openai_sdk"
mneme="$runfiles/tools/mneme"

command -v node >/dev/null 2>&1 ||
  fail "node is not on PATH ($PATH); run tools/bootstrap.sh"
# Bazel runs tests without HOME: the home folder is then the user's entry
# in the password database, as for bootstrap's default.
node_dir="${MNEME_NODE_DIR:-}"
if [ -z "$node_dir" ]; then
  home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
  [ -n "$home" ] ||
    fail "MNEME_NODE_DIR is not set and the home folder is unknown; run with MNEME_NODE_DIR=DIR set (.bazelrc passes it to tests)"
  node_dir="$home/.cache/mneme/node"
fi
[ -f "$node_dir/node_modules/openai/package.json" ] ||
  fail "no npm packages in $node_dir (node_modules/openai is missing): run tools/bootstrap.sh (it runs npm ci there), or point MNEME_NODE_DIR at where it did"
want=$(cat "$runfiles/tools/node/package.json" "$runfiles/tools/node/package-lock.json" |
  sha256sum | cut -d' ' -f1)
[ "$(cat "$node_dir/lock.sha256" 2>/dev/null)" = "$want" ] ||
  fail "the npm packages in $node_dir are not those of tools/node/package-lock.json: run tools/bootstrap.sh"
echo "node $(node --version), npm packages from $node_dir"

workdir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/openai_sdk.XXXXXX")
# The coordinator requires this API key (MNEME_API_KEY), which the cases'
# client sends as its apiKey.
api_key="sk-mneme-test-$$"
MNEME_API_KEY="$api_key" "$mneme" cluster up --tp 2 \
  --workdir "$workdir/cluster" >"$workdir/up.out" 2>&1 &
up_pid=$!
# SIGINT stops the cluster; after 60 s it is killed.
stop_cluster() {
  kill -0 "$up_pid" 2>/dev/null || return 0
  kill -INT "$up_pid"
  for _ in $(seq 1 300); do
    kill -0 "$up_pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$up_pid" 2>/dev/null; then
    echo "openai_sdk_test: the cluster did not stop within 60 s; killing it" >&2
    kill -KILL "$up_pid"
  fi
  wait "$up_pid" 2>/dev/null
}
trap stop_cluster EXIT

address=""
for _ in $(seq 1 900); do
  address=$(sed -n 's/^http at \([^ ]*\)$/\1/p' "$workdir/up.out" | head -n 1)
  [ -n "$address" ] && break
  if ! kill -0 "$up_pid" 2>/dev/null; then
    cat "$workdir/up.out" >&2
    fail "mneme cluster up exited before serving HTTP"
  fi
  sleep 0.2
done
if [ -z "$address" ]; then
  cat "$workdir/up.out" >&2
  fail "the cluster did not print 'http at ADDR' within 180 s"
fi
echo "cluster up: http at $address"

reporters=(--test-reporter=spec --test-reporter-destination=stdout)
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  reporters+=(--test-reporter="$here/junit_reporter.mjs"
    --test-reporter-destination="$XML_OUTPUT_FILE")
fi
MNEME_NODE_DIR="$node_dir" MNEME_HTTP_ADDRESS="$address" \
  MNEME_API_KEY="$api_key" node "${reporters[@]}" "$here/suite.mjs"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "--- the end of mneme cluster up's output" >&2
  tail -n 80 "$workdir/up.out" >&2
fi
stop_cluster
trap - EXIT
exit "$rc"
