#!/usr/bin/env python3
"""kvstream's chat template renderer against Python's Jinja2, byte for byte.

    check_vs_jinja2.py RENDER_TOOL DATA_DIR

DATA_DIR (tests/data/chat_templates) holds *.jinja templates, conversations.json and
hostile.json. Jinja2 runs in the environment Hugging Face transformers compiles chat templates
with (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson,
raise_exception, strftime_now) and the variables apply_chat_template passes (messages, tools,
documents, add_generation_prompt, special tokens). RENDER_TOOL (tests/frontend/render_tool.cc)
renders the same requests, read as JSON lines on its standard input.

Every template x conversation x add_generation_prompt: the outputs must be equal, or both must
fail (a template's raise_exception message must then be in kvstream's error). Hostile templates:
where Jinja2 fails kvstream must fail; where Jinja2 renders, kvstream must render the same or
refuse with NOT_SUPPORTED / RESOURCE_EXHAUSTED (never another text); cases marked
"reference": false (unbounded work for Jinja2) must fail in kvstream within its bounds.
Exit 77 (skipped) when Jinja2 is not installed.
"""

import datetime
import json
import os
import subprocess
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("skipped: python3-jinja2 is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def hf_environment():
    """transformers' _compile_jinja_template, less the {% generation %} tracker."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def reference(env, req):
    try:
        tpl = env.from_string(req["template"])
        kw = dict(req["special_tokens"])
        kw.update(req.get("variables") or {})
        return True, tpl.render(messages=req["messages"], tools=req.get("tools"), documents=None,
                                add_generation_prompt=req["add_generation_prompt"], **kw)
    except RecursionError as e:
        return False, "RecursionError: %s" % e
    except Exception as e:  # noqa: BLE001 - any failure is "Jinja2 refused"
        return False, "%s: %s" % (type(e).__name__, e)


def main():
    tool, data = sys.argv[1], sys.argv[2]
    env = hf_environment()
    with open(os.path.join(data, "conversations.json")) as f:
        convs = json.load(f)
    with open(os.path.join(data, "hostile.json")) as f:
        hostile = json.load(f)
    reqs = []
    for name in sorted(os.listdir(data)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(data, name), encoding="utf-8", newline="") as f:
            src = f.read()
        for c in convs:
            for agp in (False, True):
                reqs.append({"case": "%s/%s/agp=%s" % (name, c["name"], agp), "template": src,
                             "messages": c["messages"], "tools": c.get("tools"),
                             "variables": c.get("variables"), "add_generation_prompt": agp,
                             "special_tokens": SPECIAL, "hostile": False, "reference": True})
    for h in hostile:
        reqs.append({"case": "hostile/" + h["name"], "template": h["template"],
                     "messages": [{"role": "user", "content": "hi"}], "tools": None,
                     "variables": None, "add_generation_prompt": True, "special_tokens": SPECIAL,
                     "hostile": True, "reference": h["reference"]})
    stdin = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in reqs)
    run = subprocess.run([tool], input=stdin.encode(), capture_output=True, timeout=600)
    if run.returncode != 0:
        print("render tool failed (exit %d):\n%s" % (run.returncode, run.stderr.decode()))
        return 1
    outs = [json.loads(line) for line in run.stdout.decode().split("\n") if line]
    if len(outs) != len(reqs):
        print("render tool answered %d of %d requests" % (len(outs), len(reqs)))
        return 1
    counts = {"equal": 0, "both_fail": 0, "refused_hostile": 0, "bounded": 0}
    bad = []
    for req, out in zip(reqs, outs):
        ok_ref, ref = reference(env, req) if req["reference"] else (False, "not run")
        mine_ok = out["ok"]
        mine = out["text"] if mine_ok else "%s: %s" % (out["code"], out["error"])
        if out.get("code") == "INTERNAL":
            bad.append((req["case"], "internal error: " + mine))
        elif not req["reference"]:
            if mine_ok:
                bad.append((req["case"], "rendered a template that should exceed the bounds"))
            else:
                counts["bounded"] += 1
        elif ok_ref and mine_ok:
            if ref == mine:
                counts["equal"] += 1
            else:
                bad.append((req["case"], "differs:\n  jinja2:   %r\n  kvstream: %r" % (ref, mine)))
        elif ok_ref and not mine_ok:
            if req["hostile"] and out["code"] in ("NOT_SUPPORTED", "RESOURCE_EXHAUSTED"):
                counts["refused_hostile"] += 1
            else:
                bad.append((req["case"], "jinja2 rendered %r, kvstream failed: %s" % (ref[:200], mine)))
        elif not ok_ref and mine_ok:
            bad.append((req["case"], "jinja2 failed (%s), kvstream rendered %r" % (ref, mine[:200])))
        else:
            if ref.startswith("TemplateError: ") and ref[len("TemplateError: "):] not in mine:
                bad.append((req["case"], "raise_exception message lost: %s vs %s" % (ref, mine)))
            else:
                counts["both_fail"] += 1
    for case, why in bad:
        print("FAIL %s: %s" % (case, why))
    print("jinja2 %s, %d requests: %s, %d failures" % (jinja2.__version__, len(reqs), counts,
                                                      len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
