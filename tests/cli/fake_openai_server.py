#!/usr/bin/env python3
"""A fake OpenAI-compatible server (standard library only) that streams tokens at known times, for
the metric checks of `kvstream bench serve` (tests/cli/bench_serve_test.py).

    fake_openai_server.py --port-file F [--ttft-ms 200] [--itl-ms 50] [--log requests.jsonl]

POST /v1/completions and /v1/chat/completions stream max_tokens chunks (" t0", " t1", ...): the
first --ttft-ms after the request, the next ones every --itl-ms, then a usage chunk and [DONE],
in chunked transfer encoding. A prompt holding REJECT gets 429 in OpenAI's error shape; MIDERROR
gets one token then an error event. Every request body is appended to --log as a JSON line.
"""
import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOG_LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": "no such path", "type": "invalid_request_error",
                                           "param": None, "code": None}})

    def do_POST(self):
        start = time.monotonic()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if ARGS.log:
            with LOG_LOCK, open(ARGS.log, "a") as f:
                f.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization"),
                                    "body": body}) + "\n")
        chat = self.path == "/v1/chat/completions"
        if chat:
            prompt = json.dumps(body["messages"])
        else:
            prompt = body["prompt"] if isinstance(body["prompt"], str) else json.dumps(body["prompt"])
        if "REJECT" in prompt:
            self.send_json(429, {"error": {"message": "queue full", "type": "server_error",
                                           "param": None, "code": "queue_full"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        n = int(body.get("max_tokens", 16))
        for i in range(n):
            due = start + (ARGS.ttft_ms + i * ARGS.itl_ms) / 1000.0
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if chat:
                choice = {"index": 0, "delta": {"content": " t%d" % i}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": " t%d" % i, "finish_reason": None}
                if body.get("return_token_ids"):
                    choice["token_ids"] = [1000 + i]
            self.chunk("data: " + json.dumps({"id": "x", "choices": [choice]}) + "\n\n")
            if "MIDERROR" in prompt:
                self.chunk('data: {"error":{"message":"lost","type":"server_error","param":null,'
                           '"code":"prefill_lost"}}\n\n')
                break
        else:
            self.chunk("data: " + json.dumps({"id": "x", "choices": [], "usage": {
                "prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}}) + "\n\n")
        self.chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--ttft-ms", type=float, default=200)
    p.add_argument("--itl-ms", type=float, default=50)
    p.add_argument("--log", default="")
    ARGS = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(ARGS.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.rename(ARGS.port_file + ".tmp", ARGS.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
