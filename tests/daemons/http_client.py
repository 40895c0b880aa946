#!/usr/bin/env python3
"""A client of kvstream's OpenAI-compatible endpoint written with Python's standard library only
(http.client, socket, json, threading), driven by daemons_http_test. Each mode prints what it
checked and exits 0, or prints the first mismatch and exits 1.

  http_client.py --port P --model M [--token T] basic EXPECTED.json
  http_client.py --port P --model M [--token T] disconnect
  http_client.py --port P --model M [--token T] concurrent N
  http_client.py --port P --model M [--token T] overload N
  http_client.py --port P --model M --token T auth
  http_client.py --port P --model M chat CHECKPOINT_DIR

chat renders each conversation with Python's Jinja2 in transformers' environment
(tests/frontend/check_vs_jinja2.py) from the checkpoint's tokenizer_config.json and writes
CHECKPOINT_DIR/chat_results.json (rendered text, the endpoint's prompt_token_ids and tokens) for
the C++ test to encode and compare; exits 77 without python3-jinja2.
"""
import argparse
import http.client
import json
import os
import resource
import socket
import sys
import threading
import time

ARGS = None


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def headers(token=None, extra=None):
    h = {"Content-Type": "application/json"}
    tok = ARGS.token if token is None else token
    if tok:
        h["Authorization"] = "Bearer " + tok
    h.update(extra or {})
    return h


def request(method, path, body=None, token=None, raw=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", ARGS.port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    conn.request(method, path, body=data, headers=headers(token))
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    conn.close()
    return resp.status, resp.getheader("Content-Type"), text


def expect_error(status, text, want_status, want_param=None, what=""):
    check(status == want_status, "%s: HTTP %d, want %d: %s" % (what, status, want_status, text))
    try:
        j = json.loads(text)
    except ValueError:
        fail("%s: error body is not JSON: %r" % (what, text))
    e = j.get("error")
    check(isinstance(e, dict) and set(e) == {"message", "type", "param", "code"},
          "%s: not OpenAI's error shape: %s" % (what, text))
    check(isinstance(e["message"], str) and e["message"], "%s: empty message" % what)
    if want_param is not None:
        check(e["param"] == want_param, "%s: param %r, want %r" % (what, e["param"], want_param))
    return e


def completion(body, token=None):
    body = dict(body)
    body.setdefault("model", ARGS.model)
    status, ctype, text = request("POST", "/v1/completions", body, token)
    return status, ctype, text


def read_chunked(sock):
    """Reads a whole HTTP/1.1 response off a raw socket; returns (head, chunks as bytes list)."""
    data = b""
    while True:
        b = sock.recv(65536)
        if not b:
            break
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    chunks = []
    while True:
        size_line, sep, rest = body.partition(b"\r\n")
        check(sep == b"\r\n", "chunked body cut short: %r" % body[:80])
        size = int(size_line, 16)
        if size == 0:
            check(rest == b"\r\n", "bytes after the last chunk: %r" % rest)
            break
        chunks.append(rest[:size])
        check(rest[size:size + 2] == b"\r\n", "a chunk does not end with CRLF")
        body = rest[size + 2:]
    return head.decode(), chunks


def stream_raw(body, path="/v1/completions"):
    """A streamed completion over a raw socket: framing checked byte for byte; returns events."""
    body = dict(body, stream=True)
    body.setdefault("model", ARGS.model)
    payload = json.dumps(body).encode()
    req = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: %d\r\n" % (path, len(payload)))
    if ARGS.token:
        req += "Authorization: Bearer %s\r\n" % ARGS.token
    sock = socket.create_connection(("127.0.0.1", ARGS.port), timeout=120)
    sock.sendall(req.encode() + b"\r\n" + payload)
    head, chunks = read_chunked(sock)
    sock.close()
    check(head.startswith("HTTP/1.1 200"), "stream: " + head)
    check("Content-Type: text/event-stream" in head, "stream content type: " + head)
    check("Transfer-Encoding: chunked" in head, "stream not chunked: " + head)
    events = []
    for c in chunks:  # one SSE event per chunk: "data: <json>\n\n"
        s = c.decode("utf-8")
        check(s.startswith("data: ") and s.endswith("\n\n") and s.count("\n") == 2,
              "not one SSE event per chunk: %r" % s)
        events.append(s[len("data: "):-2])
    check(events and events[-1] == "[DONE]", "the stream does not end with data: [DONE]")
    return [json.loads(e) for e in events[:-1]]


def check_logprobs(s, t, exp):
    check(s == 200, "logprobs: %d %s" % (s, t))
    lp = json.loads(t)["choices"][0]["logprobs"]
    check(len(lp["tokens"]) == len(exp["tokens"]) and
          all(v is not None and v <= 0 for v in lp["token_logprobs"]) and
          all(1 <= len(d) <= 2 for d in lp["top_logprobs"]), "logprobs " + t)


def mode_basic(expected_path):
    with open(expected_path) as f:
        exp = json.load(f)
    # Health, readiness, models.
    s, _, t = request("GET", "/health")
    check(s == 200, "/health: %d %s" % (s, t))
    s, _, t = request("GET", "/ready")
    check(s == 200, "/ready: %d %s" % (s, t))
    s, _, t = request("GET", "/v1/models")
    check(s == 200 and json.loads(t)["data"][0]["id"] == ARGS.model, "/v1/models: " + t)

    # Non-streamed, sampled with a seed: the gRPC path's tokens and text.
    req = {"prompt": exp["prompt"], "max_tokens": exp["max_tokens"], "temperature": exp["temperature"],
           "seed": exp["seed"], "return_token_ids": True}
    s, ctype, t = completion(req)
    check(s == 200 and ctype == "application/json", "completion: %d %s" % (s, t))
    j = json.loads(t)
    c = j["choices"][0]
    check(j["object"] == "text_completion" and j["model"] == ARGS.model, t)
    check(c["token_ids"] == exp["tokens"], "tokens %s, gRPC %s" % (c["token_ids"], exp["tokens"]))
    check(c["text"] == exp["text"], "text %r, gRPC %r" % (c["text"], exp["text"]))
    check(c["finish_reason"] == "length", t)
    u = j["usage"]
    check(u["prompt_tokens"] == exp["prompt_tokens"] and u["completion_tokens"] == len(exp["tokens"])
          and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage " + t)
    # Greedy, the prompt as token ids.
    s, _, t = completion({"prompt": exp["prompt_ids"], "max_tokens": exp["max_tokens"],
                          "temperature": 0, "return_token_ids": True})
    check(s == 200 and json.loads(t)["choices"][0]["token_ids"] == exp["greedy_tokens"],
          "greedy by ids: %s, gRPC %s" % (t, exp["greedy_tokens"]))
    s, _, t = completion({"prompt": [exp["prompt_ids"]], "max_tokens": 2, "temperature": 0})
    check(s == 200, "a list of one token list: " + t)

    # Streamed, byte-level framing; the same tokens; usage in a last chunk.
    events = stream_raw(dict(req, stream_options={"include_usage": True}))
    toks, text = [], ""
    for e in events[:-1]:
        check(e["object"] == "text_completion" and len(e["choices"]) == 1, json.dumps(e))
        toks += e["choices"][0]["token_ids"]
        text += e["choices"][0]["text"]
    check(toks == exp["tokens"], "streamed tokens %s, gRPC %s" % (toks, exp["tokens"]))
    check(text == exp["text"], "streamed text %r" % text)
    check(events[-2]["choices"][0]["finish_reason"] == "length", json.dumps(events[-2]))
    check(events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(toks),
          "usage chunk " + json.dumps(events[-1]))
    # http.client reading the stream as a client library would.
    conn = http.client.HTTPConnection("127.0.0.1", ARGS.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(dict(req, model=ARGS.model, stream=True)), headers())
    resp = conn.getresponse()
    lines = [l for l in resp.read().decode().split("\n") if l]
    conn.close()
    check(lines[-1] == "data: [DONE]" and len(lines) == len(exp["tokens"]) + 1, "http.client stream: %s" % lines)

    # Logprobs: one per token, the chosen token's at most 0 (a greedy-only build refuses them).
    s, _, t = completion(dict(req, logprobs=2))
    if not exp["sampling"]:
        expect_error(s, t, 400, "logprobs", "logprobs without sampling")
        s, _, t = completion(dict(req, temperature=0.7))
        expect_error(s, t, 400, "temperature", "temperature without sampling")
    else:
        check_logprobs(s, t, exp)

    # A stop string: "stop", the text cut before it.
    if exp.get("stop"):
        s, _, t = completion(dict(req, stop=[exp["stop"]]))
        c = json.loads(t)["choices"][0]
        check(s == 200 and c["finish_reason"] == "stop" and c["text"] == exp["text"][:exp["text"].find(exp["stop"])],
              "stop %r: %s" % (exp["stop"], t))

    # Every error case, in OpenAI's shape with its status.
    s, _, t = request("POST", "/v1/completions", raw="{not json")
    expect_error(s, t, 400, None, "bad JSON")
    s, _, t = completion({"model": "no-such-model", "prompt": "x"})
    e = expect_error(s, t, 404, "model", "unknown model")
    check(e["code"] == "model_not_found", t)
    s, _, t = completion({"prompt": "x", "max_tokens": -1})
    expect_error(s, t, 400, "max_tokens", "negative max_tokens")
    s, _, t = completion({"prompt": "x", "max_tokens": 10 ** 9})
    expect_error(s, t, 400, None, "huge max_tokens")
    s, _, t = completion({"prompt": [1] * (exp["max_position"] + 1), "max_tokens": 1})
    expect_error(s, t, 400, None, "prompt over the context")
    s, _, t = completion({"prompt": "x", "n": 2})
    expect_error(s, t, 400, "n", "n=2")
    s, _, t = completion({"prompt": "x", "logit_bias": {"3": 1}})
    expect_error(s, t, 400, "logit_bias", "logit_bias")
    s, _, t = completion({"prompt": "x", "temperature": -1})
    expect_error(s, t, 400, None, "negative temperature")
    s, _, t = completion({"prompt": ["a", "b"]})
    expect_error(s, t, 400, "prompt", "two prompts")
    s, _, t = request("GET", "/v1/nothing")
    expect_error(s, t, 404, None, "unknown path")
    s, _, t = request("GET", "/v1/completions")
    expect_error(s, t, 405, None, "GET completions")
    print("basic: OK (%d tokens equal the gRPC path's, streamed and not; 11 error cases)" % len(exp["tokens"]))


def mode_disconnect():
    payload = json.dumps({"model": ARGS.model, "prompt": [1, 2, 3, 4, 5], "max_tokens": 900,
                          "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", ARGS.port), timeout=60)
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(payload))
    if ARGS.token:
        head += "Authorization: Bearer %s\r\n" % ARGS.token
    sock.sendall(head.encode() + b"\r\n" + payload)
    got = b""
    while got.count(b"data: ") < 3:
        b = sock.recv(4096)
        check(b, "the stream ended before 3 events: %r" % got[:400])
        got += b
    sock.close()  # mid-stream
    print("disconnect: closed after %d events" % got.count(b"data: "))


def stream_one(i, results, barrier, max_tokens):
    try:
        barrier.wait()
        conn = http.client.HTTPConnection("127.0.0.1", ARGS.port, timeout=600)
        body = {"model": ARGS.model, "prompt": [1 + i % 400, 2, 3, 4], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body), headers())
        resp = conn.getresponse()
        if resp.status != 200:
            results[i] = (resp.status, resp.read().decode())
            return
        events = [l for l in resp.read().decode().split("\n") if l]
        conn.close()
        ok = events and events[-1] == "data: [DONE]" and len(events) == max_tokens + 1
        results[i] = (200, "" if ok else "stream: %s" % events[-3:])
    except Exception as e:  # noqa: BLE001 - every failure is reported
        results[i] = (-1, repr(e))


def run_many(n, max_tokens):
    results = [None] * n
    barrier = threading.Barrier(n)
    threads = [threading.Thread(target=stream_one, args=(i, results, barrier, max_tokens)) for i in range(n)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.time() - t0


def mode_concurrent(n):
    results, secs = run_many(n, 8)
    bad = [r for r in results if r != (200, "")]
    check(not bad, "%d of %d streams failed, e.g. %s" % (len(bad), n, bad[:3]))
    print("concurrent: %d streams of 8 tokens, no error, %.1f s" % (n, secs))


def mode_overload(n):
    results, _ = run_many(n, 64)
    refused = [r for r in results if r[0] in (429, 503)]
    ok = [r for r in results if r == (200, "")]
    check(len(ok) + len(refused) == n, "neither served nor refused cleanly: %s" %
          [r for r in results if r not in ok and r not in refused][:3])
    check(refused, "no request was refused past the queue bound")
    check(ok, "no request was served")
    for status, text in refused:
        e = expect_error(status, text, status, None, "overload")
        check(e["type"] == "server_overloaded", text)
    print("overload: %d served, %d refused (%s) in OpenAI's shape" %
          (len(ok), len(refused), sorted(set(r[0] for r in refused))))


def mode_auth():
    s, _, t = request("GET", "/v1/models", token="")
    expect_error(s, t, 401, None, "no token")
    s, _, t = completion({"prompt": "x"}, token="")
    expect_error(s, t, 401, None, "completion without a token")
    s, _, t = completion({"prompt": [1, 2], "max_tokens": 2}, token="wrong-token-0123456789")
    e = expect_error(s, t, 401, None, "bad token")
    check(ARGS.token not in t, "the error echoes the secret")
    s, _, t = request("GET", "/health", token="")
    check(s == 200, "/health needs no credential: %d" % s)
    s, _, t = completion({"prompt": [1, 2], "max_tokens": 2, "temperature": 0})
    check(s == 200, "with the token: %d %s" % (s, t))
    print("auth: OK")


def chat(body):
    body = dict(body)
    body.setdefault("model", ARGS.model)
    return request("POST", "/v1/chat/completions", body)


def mode_chat(ck):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "frontend"))
    import check_vs_jinja2  # exits 77 without python3-jinja2
    with open(os.path.join(ck, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    tpl = check_vs_jinja2.hf_environment().from_string(cfg["chat_template"])
    special = {k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)}
    convs = [
        [{"role": "user", "content": "Hello, world!"}],
        [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}],
        [{"role": "user", "content": "Gr\u00fc\u00dfe aus \u6771\u4eac \U0001f389 {{ 7*7 }} {% if x %}"}],
    ]
    results = []
    for i, msgs in enumerate(convs):
        for agp in (True, False) if i == 1 else (True,):
            flat = [dict(m, content="\n".join(p["text"] for p in m["content"])) if isinstance(m["content"], list)
                    else m for m in msgs]
            rendered = tpl.render(messages=flat, tools=None, documents=None, add_generation_prompt=agp, **special)
            s, ctype, t = chat({"messages": msgs, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
                                "add_generation_prompt": agp})
            check(s == 200 and ctype == "application/json", "chat %d: %d %s" % (i, s, t))
            j = json.loads(t)
            c = j["choices"][0]
            check(j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-") and j["model"] == ARGS.model, t)
            check(c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str), t)
            check(c["finish_reason"] in ("length", "stop") and c["logprobs"] is None, t)
            u = j["usage"]
            check(u["prompt_tokens"] == len(j["prompt_token_ids"]) and u["completion_tokens"] == len(c["token_ids"]),
                  "usage " + t)
            results.append({"rendered": rendered, "prompt_token_ids": j["prompt_token_ids"],
                            "token_ids": c["token_ids"], "text": c["message"]["content"]})
    # Streamed: a role chunk, content deltas, a finish chunk, usage, [DONE]; the same tokens.
    first = results[0]
    events = stream_raw({"messages": convs[0], "max_tokens": 6, "temperature": 0, "return_token_ids": True,
                         "stream_options": {"include_usage": True}}, "/v1/chat/completions")
    check(all(e["object"] == "chat.completion.chunk" for e in events), json.dumps(events))
    check(events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, json.dumps(events[0]))
    toks, text = [], ""
    for e in events[1:-2]:
        d = e["choices"][0]
        check(d["finish_reason"] is None and set(d["delta"]) == {"content", "token_ids"}, json.dumps(e))
        toks += d["delta"]["token_ids"]
        text += d["delta"]["content"]
    check(toks == first["token_ids"] and text == first["text"], "streamed %s %r, not %s" % (toks, text, first))
    fin = events[-2]["choices"][0]
    check(fin["delta"] == {} and fin["finish_reason"] in ("length", "stop"), json.dumps(events[-2]))
    check(events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(toks), json.dumps(events[-1]))
    # Log-probabilities in the chat shape.
    s, _, t = chat({"messages": convs[0], "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    check(s == 200, "logprobs: %d %s" % (s, t))
    lp = json.loads(t)["choices"][0]["logprobs"]["content"]
    check(len(lp) == 3 and all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 and
                               bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in lp), t)
    # Errors: the template's own exception, a construct not implemented, its work bound, and the
    # request's.
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    for text, code, words in (("RAISE", "chat_template_error", "this test template refuses RAISE"),
                              ("UNSUPPORTED", "chat_template_not_supported", "formatting"),
                              ("LOOP", "chat_template_limit", "steps")):
        s, _, t = chat({"messages": user(text)})
        e = expect_error(s, t, 400, "messages", text)
        check(e["code"] == code and words in e["message"], "%s: %s" % (text, t))
    one = user("x")
    for body, status, param in (({"messages": one, "n": 2}, 400, "n"),
                                ({"messages": one, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
                                ({"messages": one, "response_format": {"type": "json_object"}}, 400, "response_format"),
                                ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages"),
                                ({"messages": []}, 400, "messages"),
                                ({"messages": one, "max_tokens": -1}, 400, "max_tokens"),
                                ({"messages": one, "max_tokens": 10 ** 9}, 400, None),
                                ({"messages": user("a " * 5000), "max_tokens": 1}, 400, None),
                                ({"messages": one, "model": "no-such-model"}, 404, "model")):
        s, _, t = chat(body)
        expect_error(s, t, status, param, json.dumps(body)[:80])
    s, _, t = request("POST", "/v1/chat/completions", raw="{not json")
    expect_error(s, t, 400, None, "bad JSON")
    s, _, t = request("GET", "/v1/chat/completions")
    expect_error(s, t, 405, None, "GET chat")
    with open(os.path.join(ck, "chat_results.json"), "w") as f:
        json.dump(results, f)
    print("chat: OK (%d renderings by Jinja2; streamed and not; logprobs; 15 error cases)" % len(results))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--token", default="")
    p.add_argument("mode")
    p.add_argument("arg", nargs="?")
    ARGS = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per concurrent stream
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if ARGS.mode == "basic":
        mode_basic(ARGS.arg)
    elif ARGS.mode == "disconnect":
        mode_disconnect()
    elif ARGS.mode == "concurrent":
        mode_concurrent(int(ARGS.arg))
    elif ARGS.mode == "overload":
        mode_overload(int(ARGS.arg))
    elif ARGS.mode == "auth":
        mode_auth()
    elif ARGS.mode == "chat":
        mode_chat(ARGS.arg)
    else:
        fail("unknown mode " + ARGS.mode)


if __name__ == "__main__":
    main()
