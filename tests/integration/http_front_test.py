"""The coordinator's OpenAI-compatible HTTP front with a real client
(python3's http.client) against `mneme cluster up`: both endpoints,
streaming and not, /v1/models, usage counts, SSE framing ending with
`data: [DONE]`, every error status (400, 404, 429, 503), a client that goes
away, and gRPC text prompts (`mneme generate --prompt`) agreeing with HTTP.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from junit_runner import main  # noqa: E402

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), "mneme")
MNEME = os.path.join(RUNFILES, "tools", "mneme")
COORDINATOR = os.path.join(RUNFILES, "services", "coordinator",
                           "mneme_coordinator")


def start_cluster(workdir, coordinator_flags):
    out = open(os.path.join(workdir, "up.out"), "w+")
    proc = subprocess.Popen(
        [MNEME, "cluster", "up", "--tp", "2", "--workdir",
         os.path.join(workdir, "cluster"), "--coordinator-flags",
         coordinator_flags],
        stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while time.time() < deadline:
        out.seek(0)
        text = out.read()
        http = re.search(r"^http at (\S+)$", text, re.M)
        grpc = re.search(r"^coordinator at (\S+)$", text, re.M)
        metrics = re.search(r"^coordinator pid \d+ at \S+ \(metrics on (\S+)\)",
                            text, re.M)
        if http and grpc and metrics:
            return proc, http.group(1), grpc.group(1), metrics.group(1)
        if proc.poll() is not None:
            raise RuntimeError("cluster up exited:\n" + text)
        time.sleep(0.2)
    raise RuntimeError("cluster not ready:\n" + text)


def split_address(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


def request(address, method, path, body=None, raw=None):
    """(status, parsed JSON or raw text) of one request."""
    conn = http.client.HTTPConnection(*split_address(address), timeout=120)
    data = raw if raw is not None else (
        None if body is None else json.dumps(body))
    conn.request(method, path, body=data,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def sse_events(address, path, body):
    """Every `data:` payload of a streamed response, in order, and the raw
    text (to check the framing)."""
    conn = http.client.HTTPConnection(*split_address(address), timeout=120)
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    raw = resp.read().decode()
    conn.close()
    events = [line[len("data: "):] for line in raw.split("\n")
              if line.startswith("data: ")]
    return events, raw


def metric(metrics_address, name):
    conn = http.client.HTTPConnection(*split_address(metrics_address),
                                      timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.split()[-1])
    return total


class ClusterTest(unittest.TestCase):
    """A test class with its own `cluster up`, started with
    COORDINATOR_FLAGS."""

    COORDINATOR_FLAGS = ""

    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.proc, cls.http, cls.grpc, cls.metrics = start_cluster(
            cls.workdir, cls.COORDINATOR_FLAGS)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGINT)
        cls.proc.wait(timeout=60)

    def completion(self, **fields):
        body = {"model": "mneme", "temperature": 0, "ignore_eos": True}
        body.update(fields)
        return body


class HttpFrontTest(ClusterTest):
    # One running request and one waiting at most (for the 429 case).
    COORDINATOR_FLAGS = "--max_num_seqs=1 --max_queued_requests=1"

    def test_models(self):
        status, body = request(self.http, "GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(body["object"], "list")
        self.assertEqual([m["id"] for m in body["data"]], ["mneme"])
        self.assertGreater(body["data"][0]["max_model_len"], 100)

    def test_completion_text_and_token_ids(self):
        status, body = request(self.http, "POST", "/v1/completions",
                               self.completion(prompt="Hello there, world",
                                               max_tokens=7))
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "text_completion")
        self.assertTrue(body["id"].startswith("cmpl-"))
        choice = body["choices"][0]
        self.assertIsInstance(choice["text"], str)
        self.assertEqual(choice["finish_reason"], "length")
        usage = body["usage"]
        self.assertEqual(usage["completion_tokens"], 7)
        self.assertEqual(usage["total_tokens"],
                         usage["prompt_tokens"] + usage["completion_tokens"])
        # The same prompt as token ids counts exactly those tokens.
        status, body = request(self.http, "POST", "/v1/completions",
                               self.completion(prompt=[5, 6, 7, 8, 9],
                                               max_tokens=3, logprobs=1))
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["prompt_tokens"], 5)
        self.assertEqual(len(body["choices"][0]["logprobs"]["token_logprobs"]),
                         3)

    def test_streaming_equals_non_streaming(self):
        fields = self.completion(prompt="Streaming check", max_tokens=9)
        status, whole = request(self.http, "POST", "/v1/completions", fields)
        self.assertEqual(status, 200, whole)
        events, raw = sse_events(self.http, "/v1/completions",
                                 dict(fields, stream=True))
        self.assertTrue(raw.endswith("data: [DONE]\n\n"), raw[-80:])
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        self.assertEqual(text, whole["choices"][0]["text"])
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
        for c in chunks[:-1]:
            self.assertIsNone(c["choices"][0]["finish_reason"])

    def test_chat_streaming_and_usage(self):
        fields = self.completion(
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hello!"}],
            max_tokens=6)
        status, whole = request(self.http, "POST", "/v1/chat/completions",
                                fields)
        self.assertEqual(status, 200, whole)
        self.assertEqual(whole["object"], "chat.completion")
        message = whole["choices"][0]["message"]
        self.assertEqual(message["role"], "assistant")
        events, raw = sse_events(
            self.http, "/v1/chat/completions",
            dict(fields, stream=True,
                 stream_options={"include_usage": True}))
        self.assertTrue(raw.endswith("data: [DONE]\n\n"))
        chunks = [json.loads(e) for e in events[:-1]]
        self.assertEqual(chunks[0]["object"], "chat.completion.chunk")
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"],
                         "assistant")
        content = "".join(c["choices"][0]["delta"].get("content", "")
                          for c in chunks if c["choices"])
        self.assertEqual(content, message["content"])
        usage = chunks[-1]["usage"]
        self.assertEqual(usage, whole["usage"])
        # Thinking on renders another prompt (one token longer: <think>).
        status, thinking = request(
            self.http, "POST", "/v1/chat/completions",
            dict(fields, chat_template_kwargs={"thinking": True}))
        self.assertEqual(status, 200, thinking)
        self.assertNotEqual(thinking["usage"]["prompt_tokens"],
                            whole["usage"]["prompt_tokens"])

    def test_stop_string(self):
        fields = self.completion(prompt="Stop strings", max_tokens=20)
        status, whole = request(self.http, "POST", "/v1/completions", fields)
        self.assertEqual(status, 200)
        text = whole["choices"][0]["text"]
        # Stop at the first character that has one after it.
        stop = text.strip()[:1]
        if not stop:
            self.skipTest("the model generated only whitespace")
        status, cut = request(self.http, "POST", "/v1/completions",
                              dict(fields, stop=[stop]))
        self.assertEqual(status, 200)
        self.assertEqual(cut["choices"][0]["finish_reason"], "stop")
        self.assertEqual(cut["choices"][0]["text"], text[:text.index(stop)])

    def test_bad_requests_are_400(self):
        cases = [
            (None, "{not json"),
            ({"model": "mneme", "prompt": "x", "max_tokens": "3"}, None),
            ({"model": "mneme", "prompt": "x", "temperature": -1}, None),
            ({"prompt": "x"}, None),
            ({"model": "mneme", "prompt": {"a": 1}}, None),
            ({"model": "mneme", "prompt": [1, "2"]}, None),
            ({"model": "mneme", "prompt": list(range(3, 600)) * 400}, None),
            ({"model": "mneme", "messages": []}, "chat"),
            ({"model": "mneme", "messages": [{"role": "robot",
                                              "content": "x"}]}, "chat"),
        ]
        for body, raw in cases:
            path = "/v1/chat/completions" if raw == "chat" else \
                "/v1/completions"
            status, reply = request(self.http, "POST", path, body=body,
                                    raw=None if raw == "chat" else raw)
            self.assertEqual(status, 400, (body, raw, reply))
            self.assertIn("message", reply["error"])
            self.assertEqual(reply["error"]["type"], "invalid_request_error")
        status, reply = request(self.http, "POST", "/v1/completions",
                                body={"model": "gpt-4", "prompt": "x"})
        self.assertEqual(status, 404, reply)
        self.assertEqual(reply["error"]["param"], "model")
        status, reply = request(self.http, "GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertIn("no route", reply["error"]["message"])
        # Still serving.
        status, _ = request(self.http, "POST", "/v1/completions",
                            self.completion(prompt="ok", max_tokens=1))
        self.assertEqual(status, 200)

    def open_stream(self, prompt):
        conn = http.client.HTTPConnection(*split_address(self.http),
                                          timeout=120)
        conn.request("POST", "/v1/completions",
                     body=json.dumps(self.completion(prompt=prompt,
                                                     max_tokens=400,
                                                     stream=True)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return conn, resp

    def test_admission_limit_is_429_and_disconnect_aborts(self):
        aborts = metric(self.metrics,
                        'mneme:request_success_total{finished_reason="abort"}')
        running, first = self.open_stream("first")
        self.assertEqual(first.status, 200)
        first.readline()  # The first event: it runs.
        waiting, second = self.open_stream("second")
        self.assertEqual(second.status, 200)  # Queued.
        status, reply = request(self.http, "POST", "/v1/completions",
                                self.completion(prompt="third", max_tokens=2))
        self.assertEqual(status, 429, reply)
        self.assertEqual(reply["error"]["type"], "rate_limit_error")
        # Both clients go away: their requests are aborted.
        for conn in (running, waiting):
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
        deadline = time.time() + 30
        while time.time() < deadline:
            if (metric(self.metrics, "mneme:num_requests_running") == 0 and
                    metric(self.metrics, "mneme:num_requests_waiting") == 0):
                break
            time.sleep(0.2)
        self.assertEqual(metric(self.metrics, "mneme:num_requests_running"), 0)
        self.assertEqual(metric(self.metrics, "mneme:num_requests_waiting"), 0)
        self.assertEqual(metric(self.metrics, "mneme:kv_cache_usage_perc"), 0)
        self.assertGreaterEqual(
            metric(self.metrics,
                   'mneme:request_success_total{finished_reason="abort"}'),
            aborts + 2)

    def test_grpc_text_prompt_agrees_with_http(self):
        status, body = request(self.http, "POST", "/v1/completions",
                               self.completion(prompt="Same text", max_tokens=5,
                                               ignore_eos=False))
        self.assertEqual(status, 200)
        out = subprocess.run(
            [MNEME, "generate", "--server", self.grpc, "--prompt",
             "Same text", "--max-new-tokens", "5", "--json"],
            check=True, capture_output=True, text=True).stdout
        self.assertEqual(json.loads(out)["text"], body["choices"][0]["text"])


class OpenAiFeaturesTest(ClusterTest):
    """Batched prompts, n choices, echo + logprobs as evaluation harnesses
    send them, and the tokenizer endpoints, on a cluster with room for
    several requests."""

    COORDINATOR_FLAGS = "--max_num_seqs=8"

    def checkpoint(self):
        with open(os.path.join(self.workdir, "up.out")) as f:
            return re.search(r"^checkpoint (\S+)$", f.read(), re.M).group(1)

    def test_lm_evaluation_harness_loglikelihood(self):
        """lm-evaluation-harness local-completions' loglikelihood payload
        (token-id lists, echo, logprobs 1, max_tokens 1): exactly the
        prompt's entries then one generated one, the first null, top dicts
        holding the chosen token, and the log-probabilities `mneme run
        --prompt-logprobs` computes for the same tokens."""
        contexts = [[40, 41, 42, 43, 44, 45], [300, 301, 302]]
        status, body = request(self.http, "POST", "/v1/completions", {
            "model": "mneme", "prompt": contexts, "temperature": 0,
            "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
        self.assertEqual(status, 200, body)
        choices = sorted(body["choices"], key=lambda c: c["index"])
        self.assertEqual([c["index"] for c in choices], [0, 1])
        for tokens, choice in zip(contexts, choices):
            lp = choice["logprobs"]
            self.assertEqual(len(lp["tokens"]), len(tokens) + 1)
            self.assertEqual(len(lp["token_logprobs"]), len(tokens) + 1)
            self.assertIsNone(lp["token_logprobs"][0])
            self.assertIsNone(lp["top_logprobs"][0])
            for i in range(1, len(tokens) + 1):
                top = lp["top_logprobs"][i]
                self.assertIn(lp["tokens"][i], top)
                self.assertEqual(top[lp["tokens"][i]],
                                 lp["token_logprobs"][i])
                self.assertLessEqual(len(top), 2)
            # The harness's sum over the continuation and greedy check.
            ctxlen = 2
            total = sum(lp["token_logprobs"][ctxlen:-1])
            self.assertLess(total, 0)
            ref = subprocess.run(
                [MNEME, "run", "--checkpoint", self.checkpoint(), "--tokens",
                 ",".join(map(str, tokens)), "--max-new-tokens", "1",
                 "--prompt-logprobs", "--json"],
                check=True, capture_output=True, text=True).stdout
            want = json.loads(ref)["prompt_logprobs"]
            self.assertIsNone(want[0])
            for got, ref_lp in zip(lp["token_logprobs"][1:len(tokens)],
                                   want[1:]):
                # TP 2 and its chunking against the TP 1 reference.
                self.assertAlmostEqual(got, ref_lp, delta=2e-3)
            # vLLM's prompt_logprobs rides along with echo + logprobs.
            self.assertEqual(len(choice["prompt_logprobs"]), len(tokens))

    def test_n_choices_tokenize_and_health(self):
        status, body = request(self.http, "POST", "/v1/completions",
                               self.completion(prompt="abc", max_tokens=3,
                                               n=3, temperature=1.0,
                                               seed=5))
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in body["choices"]], [0, 1, 2])
        self.assertEqual(body["usage"]["completion_tokens"], 9)
        status, tok = request(self.http, "POST", "/tokenize",
                              {"prompt": "Hello there"})
        self.assertEqual(status, 200, tok)
        self.assertEqual(tok["count"], len(tok["tokens"]))
        status, detok = request(self.http, "POST", "/detokenize",
                                {"tokens": tok["tokens"]})
        self.assertEqual(status, 200, detok)
        self.assertIn("Hello there", detok["prompt"])
        status, info = request(self.http, "GET", "/tokenizer_info")
        self.assertEqual(status, 200, info)
        self.assertIn("eos_token", info)
        self.assertEqual(request(self.http, "GET", "/health")[0], 200)
        status, version = request(self.http, "GET", "/version")
        self.assertEqual(status, 200)
        self.assertTrue(version["version"])


    def test_http_api_doc_examples_run(self):
        """Every curl example of docs/HTTP_API.md, run as written against
        this cluster: each answers JSON without an error."""
        with open(os.path.join(RUNFILES, "docs", "HTTP_API.md")) as f:
            doc = f.read()
        examples = [b for b in re.findall(r"```sh\n(.*?)```", doc, re.S)
                    if "curl" in b]
        self.assertGreaterEqual(len(examples), 7)
        env = dict(os.environ, MNEME="http://" + self.http)
        for example in examples:
            for command in re.split(r"\n(?=curl )", example.strip()):
                out = subprocess.run(["bash", "-c", "set -e\n" + command],
                                     env=env, capture_output=True,
                                     text=True, timeout=120)
                self.assertEqual(out.returncode, 0, (command, out.stderr))
                if out.stdout.startswith("data: "):
                    # A stream: JSON events, then [DONE].
                    events = [line[len("data: "):]
                              for line in out.stdout.split("\n")
                              if line.startswith("data: ")]
                    self.assertEqual(events[-1], "[DONE]", command)
                    for event in events[:-1]:
                        self.assertNotIn("error", json.loads(event), command)
                    continue
                reply = json.loads(out.stdout)
                self.assertNotIn("error", reply, (command, reply))

class ApiKeyTest(unittest.TestCase):
    """With --http_api_key_file both public APIs need the key: HTTP as
    `Authorization: Bearer`, the gRPC Serving API as `authorization`
    metadata, which `mneme generate` sends from --api-key-file or
    MNEME_API_KEY."""

    KEY = "k3y-for-the-test"

    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.key_file = os.path.join(cls.workdir, "api_key")
        with open(cls.key_file, "w") as f:
            f.write(cls.KEY + "\n")
        cls.proc, cls.http, cls.grpc, cls.metrics = start_cluster(
            cls.workdir, "--http_api_key_file=" + cls.key_file)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGINT)
        cls.proc.wait(timeout=60)

    def generate(self, *extra, env_key=None):
        env = dict(os.environ)
        env.pop("MNEME_API_KEY", None)
        if env_key is not None:
            env["MNEME_API_KEY"] = env_key
        return subprocess.run(
            [MNEME, "generate", "--server", self.grpc, "--tokens", "5,6,7",
             "--max-new-tokens", "3", "--json", *extra],
            capture_output=True, text=True, env=env)

    def test_grpc_needs_the_key(self):
        refused = self.generate()
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("API key", refused.stderr)
        wrong = self.generate(env_key="nope")
        self.assertNotEqual(wrong.returncode, 0)
        self.assertIn("wrong API key", wrong.stderr)
        by_env = self.generate(env_key=self.KEY)
        self.assertEqual(by_env.returncode, 0, by_env.stderr)
        by_file = self.generate("--api-key-file", self.key_file)
        self.assertEqual(by_file.returncode, 0, by_file.stderr)
        self.assertEqual(json.loads(by_env.stdout)["token_ids"],
                         json.loads(by_file.stdout)["token_ids"])
        self.assertEqual(len(json.loads(by_file.stdout)["token_ids"]), 3)

    def test_http_needs_the_key(self):
        status, _ = request(self.http, "GET", "/v1/models")
        self.assertEqual(status, 401)
        conn = http.client.HTTPConnection(*split_address(self.http),
                                          timeout=30)
        conn.request("GET", "/v1/models",
                     headers={"Authorization": "Bearer " + self.KEY})
        self.assertEqual(conn.getresponse().status, 200)
        conn.close()


class NotReadyTest(unittest.TestCase):
    """A coordinator whose workers never answer: 503 in OpenAI's format."""

    def test_503_until_ready(self):
        proc = subprocess.Popen(
            [COORDINATOR, "--workers=127.0.0.1:1", "--listen=127.0.0.1:0",
             "--metrics_listen=none", "--http-listen=127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            address = None
            for line in proc.stdout:
                if line.startswith("http on "):
                    address = line.split()[-1]
                    break
            self.assertIsNotNone(address)
            status, reply = request(address, "POST", "/v1/completions",
                                    {"model": "mneme", "prompt": "x"})
            self.assertEqual(status, 503, reply)
            self.assertEqual(reply["error"]["type"], "service_unavailable")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
