#!/usr/bin/env python3
"""A real Prometheus scrapes both daemons during a short load (issue 19, item 2).

  prometheus_scrape_test.py --prefill BIN --decode BIN --cli BIN [--dashboard JSON]

Starts a prefill and a decode daemon (tiny model, CPU, --metrics on loopback), Debian's
`prometheus` server with a generated config scraping both every 500 ms (temp storage, free ports),
then `kvstream bench ttft --per-request` as the load. Once Prometheus has scraped the end of the
load, asks its HTTP query API and checks against what the load generator saw:
  - request and token counts equal (decode requests, TTFT and ITL sample counts, prefill calls);
  - for each quantile q, the load generator's TTFT quantile (nearest rank over the TTFT each
    request received, GenerateResponse.since_arrival_us of its first token) lies in the bucket
    that Prometheus' histogram_quantile(q) estimate falls in. The client's own wall-clock TTFT
    (a little more: gRPC and the network) is printed beside it.
With --dashboard: every metric its queries name is in the daemons' scrapes, and every query
answers with data from this Prometheus.
Exit 77 (skipped) when the prometheus binary is not installed.
"""
import argparse
import bisect
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SCRAPE_INTERVAL_S = 0.5
QUANTILES = [0.5, 0.9, 0.99]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_file(path, proc, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{path} not written within {timeout} s")


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom, expr):
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    reply = json.loads(http_get(url))
    if reply.get("status") != "success":
        raise RuntimeError(f"query {expr}: {reply}")
    return reply["data"]["result"]


def scalar(prom, expr):
    result = query(prom, expr)
    return float(result[0]["value"][1]) if result else math.nan


def nearest_rank(values, q):
    v = sorted(values)
    k = math.ceil(q * len(v))
    return v[min(max(k, 1), len(v)) - 1]


def bucket_of(bounds, x):
    """(lower, upper] of the bucket holding x, bounds ascending (Prometheus' le)."""
    i = bisect.bisect_left(bounds, x)
    lower = bounds[i - 1] if i > 0 else 0.0
    upper = bounds[i] if i < len(bounds) else math.inf
    return lower, upper


def sample_names(text):
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def check_dashboard(path, prom, exported):
    with open(path) as f:
        dash = json.load(f)
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                exprs.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    failures = []
    if not exprs:
        failures.append("the dashboard has no query")
    for title, expr in exprs:
        names = set(re.findall(r"\bkvstream_[a-z0-9_]+", expr))
        if not names:
            failures.append(f"panel '{title}': no kvstream metric in {expr}")
        for n in sorted(names - exported):
            failures.append(f"panel '{title}': {n} is not exported by the daemons")
        concrete = expr.replace("$__rate_interval", "10s").replace("$__interval", "10s")
        try:
            if not query(prom, concrete):
                failures.append(f"panel '{title}': no data for {concrete}")
        except Exception as e:  # noqa: BLE001 - reported as a failure
            failures.append(f"panel '{title}': {e}")
    print(f"dashboard {os.path.basename(path)}: {len(exprs)} queries checked")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--dashboard")
    ap.add_argument("--requests", type=int, default=12)
    args = ap.parse_args()
    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("skipped: the prometheus server is not installed (scripts/install-deps.sh)")
        return 77

    tmp = tempfile.mkdtemp(prefix="kvstream_prom_")
    procs = []
    failures = []
    try:
        common = ["--model=tiny", "--threads=1", "--ucx_tls=tcp", "--ucx_net_devices=lo",
                  "--drain_delay_ms=0", "--listen=127.0.0.1:0"]

        def daemon(name, binary, extra):
            log = open(os.path.join(tmp, name + ".log"), "w")
            p = subprocess.Popen([binary] + common + extra + [
                f"--port_file={tmp}/{name}.port", "--metrics=127.0.0.1:0",
                f"--metrics_port_file={tmp}/{name}.mport"], stdout=log, stderr=subprocess.STDOUT)
            procs.append(p)
            return wait_file(f"{tmp}/{name}.port", p), wait_file(f"{tmp}/{name}.mport", p)

        pport, pmetrics = daemon("prefill", args.prefill, [])
        dport, dmetrics = daemon("decode", args.decode, [f"--peer=127.0.0.1:{pport}"])

        prom = free_port()
        with open(f"{tmp}/prometheus.yml", "w") as f:
            f.write(f"""global:
  scrape_interval: {int(SCRAPE_INTERVAL_S * 1000)}ms
  scrape_timeout: {int(SCRAPE_INTERVAL_S * 1000)}ms
scrape_configs:
  - job_name: kvstream-decode
    static_configs: [{{targets: ["127.0.0.1:{dmetrics}"]}}]
  - job_name: kvstream-prefill
    static_configs: [{{targets: ["127.0.0.1:{pmetrics}"]}}]
""")
        plog = open(f"{tmp}/prometheus.log", "w")
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
             f"--web.listen-address=127.0.0.1:{prom}", "--log.level=warn"],
            stdout=plog, stderr=subprocess.STDOUT))
        end = time.time() + 60
        while True:
            try:
                http_get(f"http://127.0.0.1:{prom}/-/ready", timeout=1)
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.time() > end or procs[-1].poll() is not None:
                    raise RuntimeError("prometheus did not become ready")
                time.sleep(0.1)
        # Both targets up before the load, so the first scrape sees zero.
        end = time.time() + 20
        while scalar(prom, "sum(up)") != 2:
            if time.time() > end:
                raise RuntimeError("prometheus does not see both daemons up")
            time.sleep(0.2)

        t0 = time.time()
        out = f"{tmp}/bench.jsonl"
        bench = subprocess.run(
            [args.cli, "bench", "ttft", f"--decode=127.0.0.1:{dport}",
             f"--prefill=127.0.0.1:{pport}", "--model=tiny", f"--requests={args.requests}",
             "--warmup=0", "--prompt-lens=16,64,256", "--modes=pipelined,non-pipelined",
             "--max-new-tokens=6", "--per-request", f"--json-out={out}"],
            capture_output=True, text=True, timeout=300)
        if bench.returncode != 0:
            raise RuntimeError(f"kvstream bench ttft failed: {bench.stderr[-2000:]}")
        load_s = time.time() - t0
        reqs = [json.loads(l) for l in open(out) if '"kind":"request"' in l.replace(" ", "")]
        n = len(reqs)
        itl_samples = sum(len(r["itl_ms"]) for r in reqs)
        # The TTFT each request received, in the daemon's own microseconds, as it observed them.
        server_ttft = [round(r["server_ttft_ms"] * 1000) * 1e-6 for r in reqs]
        client_ttft = [r["ttft_ms"] * 1e-3 for r in reqs]
        print(f"load: {n} requests, {itl_samples} inter-token gaps in {load_s:.1f} s")

        # Wait until Prometheus has scraped the end of the load.
        expect = {
            'kvstream_decode_requests_total{outcome="ok"}': n,
            "kvstream_decode_time_to_first_token_seconds_count": n,
            "kvstream_decode_inter_token_latency_seconds_count": itl_samples,
            'kvstream_prefill_requests_total{outcome="ok"}': n,
            "kvstream_prefill_compute_seconds_count": n,
        }
        end = time.time() + 15
        while True:
            got = {k: scalar(prom, k) for k in expect}
            if all(got[k] == v for k, v in expect.items()) or time.time() > end:
                break
            time.sleep(SCRAPE_INTERVAL_S)
        for k, v in expect.items():
            status = "ok" if got[k] == v else "MISMATCH"
            print(f"  {k}: prometheus {got[k]:g}, load generator {v}  {status}")
            if got[k] != v:
                failures.append(f"{k}: prometheus {got[k]} != load generator {v}")
        failed = scalar(prom, 'sum(kvstream_decode_requests_total{outcome!="ok"})')
        if failed != 0:
            failures.append(f"{failed} decode requests not ok")

        bounds = sorted(float(r["metric"]["le"]) for r in query(
            prom, "kvstream_decode_time_to_first_token_seconds_bucket")
            if r["metric"]["le"] != "+Inf")
        for q in QUANTILES:
            est = scalar(prom, f"histogram_quantile({q}, "
                               "kvstream_decode_time_to_first_token_seconds_bucket)")
            lower, upper = bucket_of(bounds, est)
            mine = nearest_rank(server_ttft, q)
            wall = nearest_rank(client_ttft, q)
            inside = lower < mine <= upper
            print(f"  TTFT p{q * 100:g}: prometheus {est * 1e3:.3f} ms in bucket "
                  f"({lower * 1e3:g}, {upper * 1e3:g}] ms; load generator {mine * 1e3:.3f} ms "
                  f"{'inside' if inside else 'OUTSIDE'} (its wall clock: {wall * 1e3:.3f} ms)")
            if not inside:
                failures.append(f"TTFT p{q}: load generator {mine} outside "
                                f"({lower}, {upper}] of prometheus' {est}")

        if args.dashboard:
            exported = (sample_names(http_get(f"http://127.0.0.1:{dmetrics}/metrics")) |
                        sample_names(http_get(f"http://127.0.0.1:{pmetrics}/metrics")))
            failures += check_dashboard(args.dashboard, prom, exported)
    except Exception as e:  # noqa: BLE001 - the test's failure, with the logs below
        failures.append(f"error: {e}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if failures:
            for name in ("prefill.log", "decode.log", "prometheus.log"):
                path = os.path.join(tmp, name)
                if os.path.exists(path):
                    print(f"--- {name} (last lines)")
                    print("".join(open(path, errors="replace").readlines()[-15:]))
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
