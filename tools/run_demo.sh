#!/usr/bin/env bash
# The main job, on the built-in synthetic checkpoint: installs what is
# missing, builds Mneme, starts a local cluster (an engram store, two
# tensor-parallel CPU workers with decode context parallelism, and the
# coordinator on 127.0.0.1), streams a generation from it and checks it
# against the single-process reference, asks its OpenAI-compatible HTTP API
# for a chat and a tool call; then tours the Engram tables.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
bazel build //tools:mneme //services/engram:mneme_engram_store \
  //services/worker:mneme_worker //services/coordinator:mneme_coordinator
mneme=bazel-bin/tools/mneme
work=${MNEME_DEMO_DIR:-$(mktemp -d /tmp/mneme-demo.XXXXXX)}
echo "== working in $work"

echo "== mneme make-checkpoint --model: the tiny V4.1-layout model"
rm -rf "$work/model"
"$mneme" make-checkpoint --model --out "$work/model" --seed 7

echo "== mneme cluster up --tp 2 --dcp 2 --chunk-tokens 16"
"$mneme" cluster up --checkpoint "$work/model" --tp 2 --dcp 2 \
  --chunk-tokens 16 --workdir "$work/cluster" >"$work/cluster.out" 2>&1 &
cluster_pid=$!
trap 'kill -INT $cluster_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 1200); do
  grep -q '^coordinator at ' "$work/cluster.out" 2>/dev/null && break
  kill -0 $cluster_pid 2>/dev/null || { cat "$work/cluster.out"; exit 1; }
  sleep 0.1
done
sed 's/^/   /' "$work/cluster.out"
address=$(sed -n 's/^coordinator at //p' "$work/cluster.out")
prompt=$(seq -s, 40 79)

echo "== mneme generate: tokens stream in as the cluster produces them"
"$mneme" generate --server "$address" --tokens "$prompt" \
  --max-new-tokens 24 | tr '\n' ' '
echo
"$mneme" generate --server "$address" --tokens "$prompt" \
  --max-new-tokens 24 --json >"$work/cluster.json"
"$mneme" run --checkpoint "$work/model" --tokens "$prompt" \
  --max-new-tokens 24 --json >"$work/reference.json"
/usr/bin/python3 - "$work/cluster.json" "$work/reference.json" <<'PY'
import json, sys
got, want = (json.load(open(p)) for p in sys.argv[1:3])
same = got["token_ids"] == want["token_ids"]
print("   TP 2 + DCP 2 cluster, 16-token chunks:", got["token_ids"][:8], "...")
print("   single-process reference:            ", want["token_ids"][:8], "...")
print("   identical:", same)
sys.exit(0 if same else 1)
PY
http=$(sed -n 's/^http at //p' "$work/cluster.out")
echo "== the OpenAI-compatible HTTP API (docs/HTTP_API.md): a chat, then a tool call"
/usr/bin/python3 - "$http" <<'PY'
import http.client, json, sys
def chat(body):
    conn = http.client.HTTPConnection(sys.argv[1], timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    conn.close()
    return reply
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
reply = chat({"model": "mneme", "messages": messages, "max_tokens": 12,
              "temperature": 0})
print("   chat:", json.dumps(reply["choices"][0]["message"],
                             ensure_ascii=False))
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}}}}}]
reply = chat({"model": "mneme", "messages": messages, "tools": tools,
              "tool_choice": {"type": "function",
                              "function": {"name": "get_weather"}},
              "max_tokens": 12, "temperature": 0})
choice = reply["choices"][0]
print("   tool call:", json.dumps(choice["message"]["tool_calls"],
                                  ensure_ascii=False))
print("   finish_reason:", choice["finish_reason"],
      "(random weights: the arguments are whatever the tiny model wrote)")
sys.exit(0 if choice["finish_reason"] == "tool_calls" else 1)
PY
echo "== stopping the cluster (SIGINT drains every daemon)"
kill -INT $cluster_pid
wait $cluster_pid && echo "   stopped cleanly"
trap - EXIT

dir="$work/model"
echo "== mneme engram ids: the 24 row ids of each position of a token sequence"
"$mneme" engram ids --checkpoint "$dir" --layer 1 --tokens 0,300,301,302,303
first_id=$("$mneme" engram ids --checkpoint "$dir" --layer 1 --tokens 300,301 |
  tail -n 1 | cut -d' ' -f1)
echo "== mneme engram rows: row $first_id decoded (first 8 of 256 values)"
"$mneme" engram rows --checkpoint "$dir" --layer 1 --ids "$first_id" |
  cut -d' ' -f1-8
echo "== mneme localize: the sparse local copy of rank 1 of 4 (strided split)"
"$mneme" localize --checkpoint "$dir" --out "$work/local-rank1" --tp 4 --rank 1
echo "== mneme bench engram: decode steps (48 tokens x 24 columns) from a token stream"
"$mneme" bench engram --checkpoint "$dir" --layer 1 --tokens-per-step 48 \
  --steps 100 --threads 4 --ram-cache-bytes 4194304
echo "== done: everything is in $work"
