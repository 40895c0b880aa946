"""A float32 NumPy transcription of transformers 5.x's Llama / Qwen2 / Mistral decoder and its
rope code, for making the model goldens where PyTorch + transformers are not installed.

make_model_goldens.py --reference numpy uses it. It follows, line by line:
  configuration_utils.py / modeling_rope_utils.py: convert_rope_params_to_dict and
    standardize_rope_params (a non-empty rope_scaling replaces rope_parameters; the dict's
    rope_theta wins over the top-level one, default 10000; "type" is the legacy "rope_type";
    llama3/yarn default original_max_position_embeddings to max_position_embeddings, a top-level
    original_max_position_embeddings wins), _compute_{default,linear_scaling,dynamic_ntk,yarn,
    llama3}_parameters, and dynamic_rope_update (inv_freq recomputed when a forward's
    max(position)+1 grows past the cached length; the cache keeps earlier keys as they were).
  modeling_llama.py: RMSNorm in float32, rotate_half, eager attention with GQA repeat, causal
    mask (Mistral's sliding window when set), SiLU MLP, tied LM head.
It computes every step in float32 (transformers' float32 run: weights as stored, upcast), so
golden.json's tokens are the float32-compute tokens; no bf16/fp16 activation rounding is
emulated. Real transformers goldens (--reference transformers) replace these when a machine
with transformers is at hand.
"""

import json
import math
import os
import struct

import numpy as np

F32 = np.float32
ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# ---- safetensors (reader and writer; the format is 8-byte header length, JSON, data) ----

def to_storage(a, dtype):
    """float32 array -> (bytes, float32 array of the stored values)."""
    a = np.ascontiguousarray(a, dtype=F32)
    if dtype == "float32":
        return a.tobytes(), a.copy()
    if dtype == "float16":
        h = a.astype(np.float16)
        return h.tobytes(), h.astype(F32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    back = (r.astype(np.uint32) << 16).view(F32)
    return r.tobytes(), back


def write_safetensors(path, tensors, dtype):
    """tensors: name -> float32 array, stored as dtype."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b, _ = to_storage(tensors[name], dtype)
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b0, b1 = e["data_offsets"]
        raw = data[base + b0:base + b1]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype=F32)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype=np.float16).astype(F32)
        else:
            a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(F32)
        out[name] = a.reshape(e["shape"]).astype(F32)
    return out


def read_checkpoint(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(d, fn)))
    return w


# ---- config: what transformers 5.x resolves ----

def transformers5_json(cfg):
    """The config.json transformers 5.x's save_pretrained writes for `cfg` (rope settings in
    rope_parameters, dtype instead of torch_dtype, Qwen2's layer_types)."""
    d = dict(cfg)
    rp = dict(resolve_rope(cfg))
    d.pop("rope_theta", None)
    d.pop("rope_scaling", None)
    d["rope_parameters"] = rp
    d["dtype"] = d.pop("torch_dtype")
    if d["model_type"] == "qwen2":
        d["layer_types"] = ["full_attention"] * d["num_hidden_layers"]
        d.setdefault("max_window_layers", d["num_hidden_layers"])
    if d.get("head_dim") is None:
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
    d["transformers_version"] = "5 (file layout emulated by numpy_reference.py)"
    return d


def resolve_rope(cfg):
    """convert_rope_params_to_dict + standardize_rope_params, for a flat rope dict."""
    rope_scaling = cfg.get("rope_scaling")
    rp = rope_scaling or cfg.get("rope_parameters")
    rp = dict(rp) if rp is not None else {}
    rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    if cfg.get("partial_rotary_factor") is not None:
        rp.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    rp.setdefault("rope_type", rp.get("type", "default"))
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in cfg:
            rp["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        else:
            rp.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    return rp


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rope_init(cfg, rp, seq_len=None):
    """(inv_freq float32, attention_scaling) as ROPE_INIT_FUNCTIONS[rope_type] computes them."""
    t = rp["rope_type"]
    base = rp["rope_theta"]
    dim = int(head_dim_of(cfg) * rp.get("partial_rotary_factor", 1.0))
    ar = np.arange(0, dim, 2, dtype=np.int64).astype(F32)

    def default(b):
        return (F32(1.0) / (F32(b) ** (ar / F32(dim)))).astype(F32)

    if t == "default":
        return default(base), 1.0
    if t == "linear":
        return (default(base) / F32(rp["factor"])).astype(F32), 1.0
    if t == "dynamic":
        mpe = cfg["max_position_embeddings"]
        factor = rp["factor"]
        if seq_len is None:
            b = base * ((factor * mpe / mpe) - (factor - 1)) ** (dim / (dim - 2))
            return default(b), 1.0
        s = F32(max(seq_len, mpe))
        b = F32(base) * ((F32(factor) * s / F32(mpe)) - F32(factor - 1)) ** F32(dim / (dim - 2))
        return (F32(1.0) / (F32(b) ** (ar / F32(dim)))).astype(F32), 1.0
    if t == "llama3":
        inv = default(base)
        factor = rp["factor"]
        low, high = rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wavelen = (F32(2 * math.pi) / inv).astype(F32)
        inv_l = np.where(wavelen > low_wl, inv / F32(factor), inv).astype(F32)
        smooth = ((F32(old) / wavelen - F32(low)) / F32(high - low)).astype(F32)
        smoothed = ((1 - smooth) * inv_l / F32(factor) + smooth * inv_l).astype(F32)
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return np.where(medium, smoothed, inv_l).astype(F32), 1.0
    if t == "yarn":
        factor = rp.get("factor")
        orig = rp["original_max_position_embeddings"]
        if factor is None:
            factor = cfg["max_position_embeddings"] / orig
        att = rp.get("attention_factor")
        mscale, mscale_all = rp.get("mscale"), rp.get("mscale_all_dim")

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if att is None:
            att = (float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all))
                   if mscale and mscale_all else get_mscale(factor))
        beta_fast = rp.get("beta_fast") or 32
        beta_slow = rp.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
        if rp.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        pos_freqs = (F32(base) ** (ar / F32(dim))).astype(F32)
        extra = (F32(1.0) / pos_freqs).astype(F32)
        inter = (F32(1.0) / (F32(factor) * pos_freqs)).astype(F32)
        ramp = np.clip((np.arange(dim // 2, dtype=F32) - F32(lo)) / F32(hi - lo), 0, 1).astype(F32)
        ef = (1 - ramp).astype(F32)
        return (inter * (1 - ef) + extra * ef).astype(F32), float(att)
    raise ValueError("rope type %r not mirrored" % t)


class Rotary:
    """LlamaRotaryEmbedding with dynamic_rope_update's state."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.rp = resolve_rope(cfg)
        self.type = self.rp["rope_type"]
        self.inv_freq, self.scaling = rope_init(cfg, self.rp)
        self.original_inv_freq = self.inv_freq
        self.max_seq_len_cached = self.original_max_seq_len = cfg["max_position_embeddings"]

    def __call__(self, positions):
        if "dynamic" in self.type:
            seq_len = int(max(positions)) + 1
            if seq_len > self.max_seq_len_cached:
                self.inv_freq, self.scaling = rope_init(self.cfg, self.rp, seq_len)
                self.max_seq_len_cached = seq_len
            if seq_len < self.original_max_seq_len and \
                    self.max_seq_len_cached > self.original_max_seq_len:
                self.inv_freq = self.original_inv_freq
                self.max_seq_len_cached = self.original_max_seq_len
        freqs = np.outer(np.asarray(positions, dtype=F32), self.inv_freq).astype(F32)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return ((np.cos(emb) * F32(self.scaling)).astype(F32),
                (np.sin(emb) * F32(self.scaling)).astype(F32))


def rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return (w * (x / np.sqrt(var + F32(eps)))).astype(F32)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


class Model:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.w = weights
        self.rotary = Rotary(cfg)
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads") or self.nh
        self.hd = head_dim_of(cfg)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
        self.cache = [([], []) for _ in range(cfg["num_hidden_layers"])]
        self.length = 0

    def lin(self, x, name, bias=False):
        y = x @ self.w[name + ".weight"].T
        if bias:
            y = y + self.w[name + ".bias"]
        return y.astype(F32)

    def forward(self, ids):
        """Appends ids to the sequence; returns the last position's logits."""
        n, start = len(ids), self.length
        pos = np.arange(start, start + n)
        x = self.w["model.embed_tokens.weight"][ids].astype(F32)
        cos, sin = self.rotary(pos)
        qkv_bias = self.cfg["model_type"] == "qwen2"
        for li in range(self.cfg["num_hidden_layers"]):
            p = "model.layers.%d." % li
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = self.lin(h, p + "self_attn.q_proj", qkv_bias).reshape(n, self.nh, self.hd)
            k = self.lin(h, p + "self_attn.k_proj", qkv_bias).reshape(n, self.nkv, self.hd)
            v = self.lin(h, p + "self_attn.v_proj", qkv_bias).reshape(n, self.nkv, self.hd)
            c, s = cos[:, None, :], sin[:, None, :]
            q = (q * c + rotate_half(q) * s).astype(F32)
            k = (k * c + rotate_half(k) * s).astype(F32)
            ks, vs = self.cache[li]
            ks.append(k)
            vs.append(v)
            K = np.concatenate(ks, axis=0)
            V = np.concatenate(vs, axis=0)
            rep = self.nh // self.nkv
            K = np.repeat(K, rep, axis=1)
            V = np.repeat(V, rep, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, K).astype(F32) * F32(self.hd ** -0.5)
            kpos = np.arange(K.shape[0])
            mask = kpos[None, :] > pos[:, None]
            if self.window:
                mask |= (pos[:, None] - kpos[None, :]) >= self.window
            scores = np.where(mask[None], F32(-np.inf), scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            pr = np.exp(scores).astype(F32)
            pr = (pr / pr.sum(axis=-1, keepdims=True)).astype(F32)
            att = np.einsum("hqk,khd->qhd", pr, V).astype(F32).reshape(n, self.nh * self.hd)
            x = (x + self.lin(att, p + "self_attn.o_proj")).astype(F32)
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            g = self.lin(h, p + "mlp.gate_proj")
            u = self.lin(h, p + "mlp.up_proj")
            a = (g / (1 + np.exp(-g)) * u).astype(F32)
            x = (x + self.lin(a, p + "mlp.down_proj")).astype(F32)
        self.length += n
        x = rms_norm(x[-1:], self.w["model.norm.weight"], self.eps)
        head = self.w.get("lm_head.weight")
        if head is None or self.cfg.get("tie_word_embeddings"):
            head = self.w["model.embed_tokens.weight"]
        return (x @ head.T).astype(F32)[0]


def tensor_shapes(cfg):
    h, hd = cfg["hidden_size"], head_dim_of(cfg)
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = (vocab, h)
    for li in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % li
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        out[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
        out[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
        out[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        if cfg["model_type"] == "qwen2":
            out[p + "self_attn.q_proj.bias"] = (nh * hd,)
            out[p + "self_attn.k_proj.bias"] = (nkv * hd,)
            out[p + "self_attn.v_proj.bias"] = (nkv * hd,)
        out[p + "mlp.gate_proj.weight"] = (inter, h)
        out[p + "mlp.up_proj.weight"] = (inter, h)
        out[p + "mlp.down_proj.weight"] = (h, inter)
    return out


def random_weights(cfg, seed):
    """The same scales as make_model_goldens.py's init_weights."""
    rng = np.random.RandomState(seed)
    w = {}
    for name, shape in sorted(tensor_shapes(cfg).items()):
        n = rng.standard_normal(shape).astype(F32)
        if "norm" in name:
            v = 1.0 + 0.1 * n
        elif name.endswith(".bias"):
            v = 0.2 * n
        elif "embed_tokens" in name:  # as the LM head too when tied: smaller, or it echoes
            v = 0.15 * n if cfg.get("tie_word_embeddings") else n
        elif "lm_head" in name:
            v = 0.4 * n
        elif "q_proj" in name or "k_proj" in name:
            v = 0.2 * n
        else:
            v = n / math.sqrt(shape[1])
        w[name] = v.astype(F32)
    return w


def greedy(cfg, weights, prompt, new_tokens):
    m = Model(cfg, weights)
    logits = m.forward(list(prompt))
    tokens, margins, first = [], [], logits.tolist()
    for step in range(new_tokens):
        order = np.argsort(-logits, kind="stable")
        margins.append(float(logits[order[0]] - logits[order[1]]))
        tok = int(order[0])
        tokens.append(tok)
        if step + 1 < new_tokens:
            logits = m.forward([tok])
    return tokens, margins, first, m.rotary
