#!/usr/bin/env python3
"""Checks bench/run.sh against the programs it runs (CTest bench_run_check; no GPU needed).

Runs `bench/run.sh all smoke --dry-run` with every optional step switched on, and checks each
command it prints: the program is a target of the build (or a script in bench/, or ncu), every
--flag it passes is one that program parses and every --backends= name one it makes (read from its source: the bench programs' own
parsers, cli/'s FlagSpecs for `kvstream bench`, the daemons' KV_FIELD keys). Also `bash -n` of
every bench/*.sh.

  python3 bench/check_run.py [REPO_ROOT]
"""
import glob
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
BIN = "/nonexistent-bench-bin"  # every program listed, none found: the listing does not depend on a build

# Program -> the source files whose literals name its flags.
BENCH_SOURCES = {
    "decode_attention": ["bench/decode_attention.cu"],
    "decode_timeline": ["bench/decode_timeline.cu"],
    "decode_under_load": ["bench/decode_under_load.cu"],
    "prefill_attention": ["bench/prefill_attention.cu"],
    "decode_step": ["bench/decode_step.cc"],
    "sampling_step": ["bench/sampling_step.cc"],
    "tier_prefetch": ["bench/tier_prefetch.cc", "bench/tier_bench.h", "bench/tier_interference.cc"],
    "copy_load": ["bench/copy_load.cu"],
    "scatter_bench": ["bench/transfer_gpu/scatter_bench.cc"],
    "transfer_gpu": ["bench/transfer_gpu/transfer_gpu.cc", "bench/transfer_gpu/bench_common.h"],
    "transfer_nccl": ["bench/transfer_gpu/transfer_nccl.cc", "bench/transfer_gpu/bench_common.h"],
    "ucx_notify_rtt": ["bench/transfer_gpu/ucx_notify_rtt.cc"],
    "transport_bw": ["bench/transport_bw.cc"],
    "auth_overhead": ["bench/auth_overhead.cc"],
}
SKIP_PREFIXES = ("#", "[", "export ", "source ", "wait", "nvidia-cuda-mps-control")


def read(paths):
    text = ""
    for p in paths:
        with open(os.path.join(ROOT, p), errors="replace") as f:
            text += f.read()
    return text


def sources(pattern):
    out = []
    for p in glob.glob(os.path.join(ROOT, "**", pattern), recursive=True):
        rel = os.path.relpath(p, ROOT)
        if not rel.startswith(("build", ".git", "bench/out", ".devbuild")):
            out.append(rel)
    return out


def targets():
    names = set()
    for cm in sources("CMakeLists.txt"):
        t = read([cm])
        names.update(re.findall(r"add_executable\(\s*([A-Za-z0-9_.-]+)", t))
        names.update(re.findall(r"kvstream_add_test\(\s*NAME\s+([A-Za-z0-9_.-]+)", t))
    return names


def main():
    errors = []
    for sh in sorted(glob.glob(os.path.join(ROOT, "bench", "*.sh"))):
        r = subprocess.run(["bash", "-n", sh], capture_output=True, text=True)
        if r.returncode:
            errors.append(f"bash -n {os.path.relpath(sh, ROOT)}: {r.stderr.strip()}")
    knobs = ["NGPU=2", "CPU_COST=1", "LANDED_WAIT=both", "PACE_FRACTION=0.5", "MPS=1", "NCU=1",
             "UCX_TLS=tcp", "CHUNK_MB=16", "SCATTER_CONFIGS=t256u8", "LONG_BLOCKS=1024",
             "EXTRA_MODEL_FLAGS=--max-position 32768", "EXTRA_DECODE_FLAGS=--first_step_after_load=false",
             "PACE_BYTES_PER_S=40000000000", "GTEST_FILTER=*", "OUT=/tmp/bench-check-out", "BIN=" + BIN]
    runs = []
    for suites in (["all"], ["smoke"]):
        r = subprocess.run(["bash", os.path.join(ROOT, "bench", "run.sh"), *suites, "--dry-run", *knobs],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
        if r.returncode:
            errors.append(f"run.sh {' '.join(suites)} --dry-run: rc {r.returncode}: {r.stderr[-500:]}")
        runs.append(r.stdout)
    built = targets()
    cli = read([p for p in sources("*.cc") if p.startswith("cli/")])
    daemon_keys = set()
    for p in sources("*.cc"):
        daemon_keys.update(re.findall(r"KV_FIELD\(\s*([a-z0-9_]+)\s*,", read([p])))
    checked = set()
    for line in "\n".join(runs).splitlines():
        line = line.strip()
        if not line or line.startswith(SKIP_PREFIXES):
            continue
        words = shlex.split(re.split(r"\s(?:>>|>)\s", line)[0].rstrip("&").strip())
        if words[:1] == ["timeout"]:
            words = words[4:] if words[1] == "-k" else words[2:]
        if words[:1] == ["env"]:
            words = words[1:]
            while words and (words[0] == "-u" or "=" in words[0] or (words[0].isupper())):
                words = words[2:] if words[0] == "-u" else words[1:]
        if words[:1] == ["bash"]:
            words = words[1:]
        if not words:
            continue
        prog = words[0]
        name = os.path.basename(prog)
        flags = [w.split("=", 1)[0] for w in words[1:] if w.startswith("--")]
        if name == "python3":
            script = os.path.relpath(words[1], ROOT) if os.path.isabs(words[1]) else words[1]
            if not os.path.exists(os.path.join(ROOT, script)):
                errors.append(f"{script}: no such script ({line[:120]})")
                continue
            text, what = read([script]), script
            flags = [w.split("=", 1)[0] for w in words[2:] if w.startswith("--")]
            ok = lambda f: f'"{f}"' in text
        elif name == "ncu" or name.endswith("run_memcheck.sh"):
            continue
        elif prog.startswith(BIN + "/"):
            if name not in built:
                errors.append(f"{name}: not a target of the build ({line[:120]})")
                continue
            what = name
            if name == "kvstream":
                sub = " ".join(words[1:3])
                text = cli
                flags = [w.split("=", 1)[0] for w in words[3:] if w.startswith("--")]
                ok = lambda f: f'"{f[2:]}"' in text
                what = f"kvstream {sub}"
            elif name in ("kvstream-prefill", "kvstream-decode"):
                ok = lambda f: f[2:].replace("-", "_") in daemon_keys
            elif name in BENCH_SOURCES:
                text = read(BENCH_SOURCES[name])
                ok = lambda f: f'"{f}"' in text or f'"{f}=' in text or f'"{f[2:]}"' in text
            else:  # a test binary: gtest's own flags
                ok = lambda f: f.startswith("--gtest_")
        else:
            errors.append(f"unexpected command: {line[:160]}")
            continue
        for f in flags:
            checked.add((what, f))
            if not ok(f):
                errors.append(f"{what}: flag {f} is not one it parses ({line[:120]})")
        if name in ("transfer_gpu", "transfer_nccl"):  # each backend (variant suffixes aside) it makes
            for w in words[1:]:
                for b in (w.split("=", 1)[1].split(",") if w.startswith("--backends=") else []):
                    checked.add((what, b))
                    if f'"{b.split(":")[0]}"' not in text:
                        errors.append(f"{what}: backend {b} is not one it makes ({line[:120]})")
    for e in sorted(set(errors)):
        print("check_run:", e, file=sys.stderr)
    print(f"check_run: {len(checked)} (program, flag) pairs checked, {len(set(errors))} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
