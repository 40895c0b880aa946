#!/usr/bin/env python3
"""Makes the model goldens under tests/data/model_goldens/ with PyTorch + transformers.

Run where torch and transformers (5.x) are installed (no network needed; everything is random):
    python3 scripts/goldens/make_model_goldens.py --out tests/data/model_goldens
Where they are not (no GPU machine at hand), --reference numpy uses numpy_reference.py beside
this file: a float32 NumPy transcription of transformers' decoder and rope code (its docstring
says what it follows); golden.json's "reference" field says which one made a case.

For each case it writes a small random checkpoint (config.json + safetensors) in one of the
config forms kvstream reads, then loads it back with transformers (as a user would) and records
in golden.json:
  tokens          greedy tokens (KV-cached decode, one token per step, as generate() does) with
                  the checkpoint's own dtype
  tokens_f32      the same with the weights upcast to float32 (what kvstream's CPU path computes)
  logits_first    the first generated position's logits (checkpoint dtype), logits_first_f32
  margins_f32     top-1 minus top-2 logit of every step (float32 run)
  inv_freq, attention_scaling, rope_parameters: what transformers derived from the config.
A case's random seed is retried until tokens == tokens_f32 on every step and the float32 run's
smallest margin clears a floor, so the case tests the model math rather than rounding luck.

rope_cases.json records transformers' inv_freq / attention scaling for configs without weights
(precedence between rope_theta / rope_parameters / rope_scaling, every rope type's options,
dynamic NTK at several lengths).
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

VOCAB = 256
NEW_TOKENS = 16
DEADLINE = [float("inf")]  # no more retries after this time
DTYPES = {}


def import_torch():
    """PyTorch and transformers, only for --reference transformers."""
    global torch, transformers, save_file, AutoConfig, AutoModelForCausalLM
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM
    DTYPES.update({"float32": torch.float32, "float16": torch.float16,
                   "bfloat16": torch.bfloat16})


def base_config(arch, dtype, **over):
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                  "MistralForCausalLM": "mistral"}[arch]
    c = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": VOCAB,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if model_type == "llama":
        c["attention_bias"] = False
        c["mlp_bias"] = False
    if model_type == "qwen2":
        c["use_sliding_window"] = False
        c["sliding_window"] = None
    if model_type == "mistral":
        c["sliding_window"] = None
    c.update(over)
    return c


# name, description, config.json (dict), form, prompt length, shards
# form: "legacy" = the dict is written as is (rope_theta / rope_scaling, as transformers 4.x
# wrote them); "transformers" = the dict is turned into a config object and saved by
# transformers' own save_pretrained (the 5.x file format: rope_parameters, dtype).
CASES = [
    ("llama3_gqa_rope_parameters_bf16",
     "Llama 3 style GQA (4 query heads on 2 KV heads, head_dim 64 != hidden/heads), rope_theta "
     "only inside rope_parameters (the issue's silent failure)",
     base_config("LlamaForCausalLM", "bfloat16", num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
     "transformers", 12, 1),
    ("llama_legacy_rope_theta_f32",
     "Llama, top-level rope_theta and rope_scaling null (transformers 4.x form), float32",
     base_config("LlamaForCausalLM", "float32", rope_theta=250000.0, rope_scaling=None),
     "legacy", 12, 1),
    ("llama31_llama3_tied_bf16",
     "Llama 3.1/3.2 style llama3 rope_scaling (legacy form), tied embeddings, context past "
     "original_max_position_embeddings=32",
     base_config("LlamaForCausalLM", "bfloat16", rope_theta=10000.0, tie_word_embeddings=True,
                 rope_scaling={"factor": 4.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 32, "rope_type": "llama3"}),
     "legacy", 40, 1),
    ("llama3_rope_parameters_head_dim_f16",
     "llama3 scaling in rope_parameters, explicit head_dim 128 (!= hidden/heads), float16",
     base_config("LlamaForCausalLM", "float16", head_dim=128,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}),
     "transformers", 40, 1),
    ("qwen2_yarn_bf16",
     "Qwen2.5 style YaRN ({'type': 'yarn'} legacy key), QKV bias, context past the original 32",
     base_config("Qwen2ForCausalLM", "bfloat16", rope_theta=1000000.0, rms_norm_eps=1e-6,
                 rope_scaling={"type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32}),
     "legacy", 40, 1),
    ("llama_yarn_options_f16",
     "YaRN with beta_fast/beta_slow, attention_factor and truncate=false in rope_parameters, "
     "4 query heads on 2 KV heads of 64",
     base_config("LlamaForCausalLM", "float16", num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32, "beta_fast": 16.0,
                                  "beta_slow": 2.0, "attention_factor": 1.25,
                                  "truncate": False}),
     "transformers", 40, 1),
    ("llama_yarn_mscale_bf16",
     "YaRN with mscale / mscale_all_dim (attention factor derived from them)",
     base_config("LlamaForCausalLM", "bfloat16", rope_theta=10000.0,
                 rope_scaling={"rope_type": "yarn", "factor": 8.0,
                               "original_max_position_embeddings": 16, "mscale": 1.0,
                               "mscale_all_dim": 0.5}),
     "legacy", 40, 1),
    ("llama_linear_f16",
     "linear rope_scaling ({'type': 'linear', 'factor': 2.0}), float16",
     base_config("LlamaForCausalLM", "float16", rope_theta=10000.0,
                 rope_scaling={"type": "linear", "factor": 2.0}),
     "legacy", 24, 1),
    ("llama_dynamic_bf16",
     "dynamic NTK, max_position_embeddings=32: the prompt fits, decode crosses 32 (each new "
     "step recomputes inv_freq; earlier keys keep their rotation)",
     base_config("LlamaForCausalLM", "bfloat16", rope_theta=10000.0, max_position_embeddings=32,
                 rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
     "legacy", 24, 1),
    ("llama_dynamic_prompt_past_f16",
     "dynamic NTK in rope_parameters, the prompt itself past max_position_embeddings=32",
     base_config("LlamaForCausalLM", "float16", max_position_embeddings=32,
                 rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
     "transformers", 40, 1),
    ("qwen2_bias_tied_f16",
     "Qwen2 with QKV bias, tied embeddings (small Qwen2.5), rope_theta 1e6, float16",
     base_config("Qwen2ForCausalLM", "float16", rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=True),
     "legacy", 12, 1),
    ("qwen2_rope_parameters_bf16",
     "Qwen2 saved by transformers 5.x (rope_parameters, layer_types), 4 query heads on 2 KV "
     "heads of 64",
     base_config("Qwen2ForCausalLM", "bfloat16", rms_norm_eps=1e-6, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     "transformers", 12, 1),
    ("mistral_bf16",
     "MistralForCausalLM, sliding_window null, rope_theta 1e6",
     base_config("MistralForCausalLM", "bfloat16", rope_theta=1000000.0),
     "legacy", 12, 1),
    ("mistral_window_f16",
     "MistralForCausalLM with sliding_window=64 = max_position_embeddings (never exceeded)",
     base_config("MistralForCausalLM", "float16", rope_theta=10000.0, sliding_window=64,
                 max_position_embeddings=64),
     "transformers", 12, 1),
    ("llama_sharded_bf16",
     "Llama in three safetensors shards with model.safetensors.index.json",
     base_config("LlamaForCausalLM", "bfloat16", rope_theta=500000.0),
     "legacy", 12, 3),
]


def write_config(cfg, form, dest):
    """Writes dest/config.json; returns the dict actually written."""
    if form == "legacy":
        with open(os.path.join(dest, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        return cfg
    kw = dict(cfg)
    kw.pop("architectures")
    model_type = kw.pop("model_type")
    dtype = kw.pop("torch_dtype")
    conf = AutoConfig.for_model(model_type, **kw)
    conf.architectures = cfg["architectures"]
    for attr in ("dtype", "torch_dtype"):
        try:
            setattr(conf, attr, DTYPES[dtype])
            break
        except Exception:  # noqa: BLE001 - older/newer attribute names
            continue
    tmp = tempfile.mkdtemp()
    conf.save_pretrained(tmp)
    shutil.copy(os.path.join(tmp, "config.json"), os.path.join(dest, "config.json"))
    shutil.rmtree(tmp)
    with open(os.path.join(dest, "config.json")) as f:
        return json.load(f)


def load_model(path, dtype):
    for key in ("dtype", "torch_dtype"):
        try:
            m = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                     **{key: dtype})
            return m.eval()
        except TypeError:
            continue
    raise RuntimeError("could not load " + path)


def init_weights(model, seed, tied):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                v = 1.0 + 0.1 * n
            elif name.endswith(".bias"):
                v = 0.2 * n
            elif "embed_tokens" in name:  # as the LM head too when tied: smaller, or it echoes
                v = 0.15 * n if tied else n
            elif "lm_head" in name:
                v = 0.4 * n
            elif "q_proj" in name or "k_proj" in name:
                v = 0.2 * n
            else:
                v = n / math.sqrt(p.shape[1])
            p.copy_(v)


def write_shards(dest, tensors, shards, save, nbytes):
    """One model.safetensors, or `shards` files and model.safetensors.index.json.
    save(path, {name: tensor}) writes one file; nbytes(tensor) is its data size."""
    names = sorted(tensors)
    if shards == 1:
        save(os.path.join(dest, "model.safetensors"), tensors)
        return
    per = (len(names) + shards - 1) // shards
    weight_map, total = {}, 0
    for i in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = {k: tensors[k] for k in names[i * per:(i + 1) * per]}
        save(os.path.join(dest, fname), part)
        for k, v in part.items():
            weight_map[k] = fname
            total += nbytes(v)
    with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def save_weights(model, tied, dtype, dest, shards):
    sd = {k: v.detach().to(DTYPES[dtype]).contiguous().clone() for k, v in model.state_dict().items()}
    if tied:
        sd.pop("lm_head.weight", None)
    write_shards(dest, sd, shards, lambda path, part: save_file(part, path, metadata={"format": "pt"}),
                 lambda v: v.numel() * v.element_size())


def greedy(model, prompt):
    """Greedy decode with the KV cache, one token per step (what generate(do_sample=False) does)."""
    with torch.no_grad():
        return greedy_steps(model, prompt)


def greedy_steps(model, prompt):
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    tokens, margins, first = [], [], None
    for step in range(NEW_TOKENS):
        logits = out.logits[0, -1].float()
        if first is None:
            first = logits.tolist()
        top = torch.topk(logits, 2)
        margins.append(float(top.values[0] - top.values[1]))
        tok = int(top.indices[0])
        tokens.append(tok)
        if step + 1 < NEW_TOKENS:
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values,
                        use_cache=True)
    return tokens, margins, first


def generate_tokens(model, prompt):
    try:
        gc = transformers.GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS,
                                           min_new_tokens=0, eos_token_id=None, pad_token_id=0)
        out = model.generate(torch.tensor([prompt]), generation_config=gc)
        return out[0, len(prompt):].tolist()
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        return "error: %s" % e


def rope_info(model):
    rot = model.model.rotary_emb
    rp = getattr(model.config, "rope_parameters", None)
    return {
        "rope_parameters": json.loads(json.dumps(rp, default=str)) if rp is not None else None,
        "inv_freq": [float(x) for x in rot.inv_freq.float().tolist()],
        "attention_scaling": float(getattr(rot, "attention_scaling", 1.0)),
        "rope_type": str(getattr(rot, "rope_type", "")),
    }


def r(x):
    return float("%.7g" % x)


def make_case(out_root, case, floor_rel, max_tries):
    name, desc, cfg, form, prompt_len, shards = case
    dtype = cfg["torch_dtype"]
    last_err = None
    for attempt in range(max_tries):
        seed = 1000 * (1 + CASES.index(case)) + attempt
        dest = os.path.join(out_root, name)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        written = write_config(cfg, form, dest)
        conf = AutoConfig.from_pretrained(dest)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(conf)
        model = model.float()
        init_weights(model, seed, bool(cfg.get("tie_word_embeddings")))
        save_weights(model, bool(cfg.get("tie_word_embeddings")), dtype, dest, shards)
        del model
        g = torch.Generator().manual_seed(seed + 7)
        prompt = torch.randint(0, VOCAB, (prompt_len,), generator=g).tolist()
        native = load_model(dest, DTYPES[dtype])
        f32 = load_model(dest, torch.float32)
        info = rope_info(f32)  # before decoding: dynamic NTK rewrites inv_freq as it goes
        tokens, margins, first = greedy(native, prompt)
        tokens32, margins32, first32 = greedy(f32, prompt)
        scale = max(abs(x) for x in first32)
        ok = tokens == tokens32 and min(margins32) >= floor_rel * scale and len(set(tokens)) >= 6
        last_err = "tokens %s vs f32 %s, min f32 margin %.3g (scale %.3g)" % (
            tokens, tokens32, min(margins32), scale)
        if not ok and attempt + 1 < max_tries and time.time() < DEADLINE[0]:
            continue
        gen = generate_tokens(load_model(dest, DTYPES[dtype]), prompt)
        golden = {
            "case": name,
            "description": desc,
            "form": form,
            "dtype": dtype,
            "seed": seed,
            "attempts": attempt + 1,
            "conditioned": ok,
            "prompt": prompt,
            "tokens": tokens,
            "tokens_f32": tokens32,
            "generate_tokens": gen,
            "margins": [r(x) for x in margins],
            "margins_f32": [r(x) for x in margins32],
            "logits_first": [r(x) for x in first],
            "logits_first_f32": [r(x) for x in first32],
            "max_abs_logit_f32": r(scale),
            "config_written": written,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
        golden.update(info)
        with open(os.path.join(dest, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
        return {"case": name, "ok": ok, "attempts": attempt + 1, "note": last_err}
    return {"case": name, "ok": False, "note": last_err}


def make_case_numpy(out_root, case, floor_rel, max_tries):
    import numpy as np
    import numpy_reference as nr
    name, desc, cfg, form, prompt_len, shards = case
    dtype = cfg["torch_dtype"]
    for attempt in range(max_tries):
        seed = 1000 * (1 + CASES.index(case)) + attempt
        dest = os.path.join(out_root, name)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        written = cfg if form == "legacy" else nr.transformers5_json(cfg)
        with open(os.path.join(dest, "config.json"), "w") as f:
            json.dump(written, f, indent=2)
        with open(os.path.join(dest, "config.json")) as f:
            conf = json.load(f)
        write_shards(dest, nr.random_weights(conf, seed), shards,
                     lambda path, part: nr.write_safetensors(path, part, dtype),
                     lambda v: v.size * (4 if dtype == "float32" else 2))
        weights = nr.read_checkpoint(dest)
        prompt = np.random.RandomState(seed + 7).randint(0, VOCAB, prompt_len).tolist()
        rot = nr.Rotary(conf)
        inv_freq, scaling = rot.inv_freq.tolist(), rot.scaling
        tokens, margins, first, _ = nr.greedy(conf, weights, prompt, NEW_TOKENS)
        scale = max(abs(x) for x in first)
        ok = min(margins) >= floor_rel * scale and len(set(tokens)) >= 6  # not an echo
        note = "min margin %.3g (scale %.3g)" % (min(margins), scale)
        if not ok and attempt + 1 < max_tries and time.time() < DEADLINE[0]:
            continue
        golden = {
            "case": name, "description": desc, "form": form, "dtype": dtype, "seed": seed,
            "attempts": attempt + 1, "conditioned": ok,
            "reference": "numpy_reference.py (float32 transcription of transformers 5.x); "
                         "tokens are the float32-compute tokens",
            "prompt": prompt, "tokens": tokens, "tokens_f32": tokens,
            "margins": [r(x) for x in margins], "margins_f32": [r(x) for x in margins],
            "logits_first": [r(x) for x in first], "logits_first_f32": [r(x) for x in first],
            "max_abs_logit_f32": r(scale), "config_written": written,
            "rope_parameters": nr.resolve_rope(conf), "inv_freq": inv_freq,
            "attention_scaling": scaling, "rope_type": nr.resolve_rope(conf)["rope_type"],
        }
        with open(os.path.join(dest, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
        return {"case": name, "ok": ok, "attempts": attempt + 1, "note": note}
    return {"case": name, "ok": False}


def make_rope_cases_numpy(out_root):
    import numpy_reference as nr
    results = []
    for name, cfg, seq_lens in rope_case_configs():
        rec = {"name": name, "config": cfg}
        try:
            rec["rope_parameters"] = nr.resolve_rope(cfg)
            rot = nr.Rotary(cfg)
            rec["inv_freq"] = rot.inv_freq.tolist()
            rec["attention_scaling"] = rot.scaling
            if seq_lens:
                rec["dynamic"] = []
                for s in seq_lens:
                    rot = nr.Rotary(cfg)
                    rot(list(range(s)))
                    rec["dynamic"].append({"seq_len": s, "inv_freq": rot.inv_freq.tolist()})
        except Exception as e:  # noqa: BLE001 - recorded
            rec["error"] = "%s: %s" % (type(e).__name__, e)
        results.append(rec)
    with open(os.path.join(out_root, "rope_cases.json"), "w") as f:
        json.dump({"reference": "numpy_reference.py", "cases": results}, f, indent=1)


# Configs without weights: what transformers derives (inv_freq, attention scaling).
def rope_case_configs():
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 4, "vocab_size": 32, "max_position_embeddings": 4096}

    def c(**over):
        d = dict(base)
        d.update(over)
        return d

    return [
        ("no_rope_keys", c(), None),
        ("rope_theta_only", c(rope_theta=500000.0), None),
        ("rope_parameters_default", c(rope_parameters={"rope_type": "default",
                                                      "rope_theta": 500000.0}), None),
        ("rope_parameters_without_theta", c(rope_parameters={"rope_type": "default"}), None),
        ("rope_parameters_theta_and_top_level_theta",
         c(rope_theta=1000000.0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
         None),
        ("rope_parameters_and_rope_scaling",
         c(rope_parameters={"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0},
           rope_scaling={"rope_type": "linear", "factor": 4.0}), None),
        ("rope_scaling_type_key", c(rope_theta=10000.0, rope_scaling={"type": "linear",
                                                                      "factor": 3.0}), None),
        ("linear", c(rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}),
         None),
        ("dynamic", c(rope_theta=10000.0, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
         [4096, 4097, 5000, 12000]),
        ("llama3_31_8b", c(head_dim=128, hidden_size=4096, num_attention_heads=32,
                           max_position_embeddings=131072, rope_theta=500000.0,
                           rope_scaling={"factor": 8.0, "high_freq_factor": 4.0,
                                         "low_freq_factor": 1.0,
                                         "original_max_position_embeddings": 8192,
                                         "rope_type": "llama3"}), None),
        ("llama3_32_1b_head64", c(head_dim=64, max_position_embeddings=131072,
                                  rope_theta=500000.0,
                                  rope_scaling={"factor": 32.0, "high_freq_factor": 4.0,
                                                "low_freq_factor": 1.0,
                                                "original_max_position_embeddings": 8192,
                                                "rope_type": "llama3"}), None),
        ("yarn_qwen25", c(head_dim=128, hidden_size=512, max_position_embeddings=32768,
                          rope_theta=1000000.0,
                          rope_scaling={"type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 32768}), None),
        ("yarn_no_original", c(rope_theta=10000.0,
                               rope_scaling={"rope_type": "yarn", "factor": 4.0}), None),
        ("yarn_options", c(rope_theta=10000.0,
                           rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 1024,
                                         "beta_fast": 16.0, "beta_slow": 2.0,
                                         "attention_factor": 0.9, "truncate": False}), None),
        ("yarn_mscale", c(rope_theta=10000.0,
                          rope_scaling={"rope_type": "yarn", "factor": 40.0,
                                        "original_max_position_embeddings": 1024,
                                        "mscale": 0.707, "mscale_all_dim": 0.707}), None),
        ("yarn_mscale_unequal", c(rope_theta=10000.0,
                                  rope_scaling={"rope_type": "yarn", "factor": 40.0,
                                                "original_max_position_embeddings": 1024,
                                                "mscale": 1.0, "mscale_all_dim": 0.5}), None),
        ("top_level_original_max", c(rope_theta=10000.0, original_max_position_embeddings=512,
                                     rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 1024}),
         None),
    ]


def make_rope_cases(out_root):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    results = []
    for name, cfg, seq_lens in rope_case_configs():
        rec = {"name": name, "config": cfg}
        try:
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            conf = AutoConfig.from_pretrained(tmp)
            shutil.rmtree(tmp)
            rp = getattr(conf, "rope_parameters", None)
            rec["rope_parameters"] = json.loads(json.dumps(rp, default=str))
            rot = LlamaRotaryEmbedding(config=conf)
            rec["inv_freq"] = [float(x) for x in rot.inv_freq.float().tolist()]
            rec["attention_scaling"] = float(rot.attention_scaling)
            if seq_lens:
                rec["dynamic"] = []
                hd = conf.head_dim if getattr(conf, "head_dim", None) else \
                    conf.hidden_size // conf.num_attention_heads
                for s in seq_lens:
                    rot = LlamaRotaryEmbedding(config=conf)
                    x = torch.zeros(1, 1, s, hd)
                    rot(x, torch.arange(s)[None])
                    rec["dynamic"].append({"seq_len": s, "inv_freq": [
                        float(v) for v in rot.inv_freq.float().tolist()]})
        except Exception as e:  # noqa: BLE001 - recorded
            rec["error"] = "%s: %s" % (type(e).__name__, e)
        results.append(rec)
    with open(os.path.join(out_root, "rope_cases.json"), "w") as f:
        json.dump({"versions": {"torch": torch.__version__,
                                "transformers": transformers.__version__},
                   "cases": results}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--reference", choices=["transformers", "numpy"], default="transformers")
    ap.add_argument("--tries", type=int, default=40)
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds after which no case is retried (0 = none)")
    ap.add_argument("--floor", type=float, default=2e-3,
                    help="smallest float32 top-2 margin, relative to the largest |logit|")
    a = ap.parse_args()
    if a.deadline > 0:
        DEADLINE[0] = time.time() + a.deadline
    if a.reference == "transformers":
        import_torch()
        torch.set_num_threads(min(8, os.cpu_count() or 1))
        make, make_rope = make_case, make_rope_cases
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        make, make_rope = make_case_numpy, make_rope_cases_numpy
    os.makedirs(a.out, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    summary = []
    for case in CASES:
        if only and case[0] not in only:
            continue
        try:
            res = make(a.out, case, a.floor, a.tries)
        except Exception:  # noqa: BLE001 - keep going, report
            res = {"case": case[0], "ok": False, "note": traceback.format_exc()}
        print(json.dumps(res), flush=True)
        summary.append(res)
    try:
        make_rope(a.out)
    except Exception:  # noqa: BLE001
        print("rope_cases failed:\n" + traceback.format_exc(), flush=True)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    bad = [s["case"] for s in summary if not s["ok"]]
    print("cases: %d, not conditioned or failed: %s" % (len(summary), bad or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
