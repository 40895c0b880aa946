#!/usr/bin/env python3
"""Trains two small SentencePiece models with the `sentencepiece` Python package and records its
encodings and decodings of tests/tokenizer/data/corpus.jsonl as goldens (docs/tokenizers.md).

  python3 scripts/goldens/make_sp_goldens.py [OUT_DIR]     # default tests/tokenizer/data

sp_bpe: Llama 2's trainer settings (BPE, byte fallback, digits split, no extra-whitespace removal,
identity normalization). sp_unigram: a unigram model with SentencePiece's default NFKC-based
normalization and a user-defined symbol. Encodings are `[bos] + encode(text)`, as Hugging Face's
LlamaTokenizer adds BOS by default.
"""
import io
import json
import os
import random
import sys

import sentencepiece as spm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "tests/tokenizer/data"))
CORPUS = [json.loads(l) for l in open(os.path.join(REPO, "tests/tokenizer/data/corpus.jsonl"), encoding="utf-8") if l.strip()]


def training_sentences():
    lines = []
    for _ in range(8):
        lines += [s for s in CORPUS if s.strip()]
    for f in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]:
        if os.path.exists(f):
            lines += [l for l in open(f, encoding="utf-8").read().split("\n") if l.strip()]
    return lines


def train(**kw):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_sentences()), model_writer=model,
                                   minloglevel=2, **kw)
    return model.getvalue()


def record(name, blob):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(blob)
    sp = spm.SentencePieceProcessor(model_proto=blob)
    bos = [sp.bos_id()] if sp.bos_id() >= 0 else []
    cases = []
    for line in CORPUS:
        plain = sp.encode(line)
        ids = bos + plain
        cases.append({"ids": ids, "ids_plain": plain, "text": sp.decode(ids)})
    n = sp.get_piece_size()
    single = [sp.decode([i]) for i in range(n)]
    r = random.Random(17)
    rand = []
    for _ in range(60):
        ids = [r.randrange(n) for _ in range(r.randint(1, 12))]
        rand.append({"ids": ids, "text": sp.decode(ids)})
    out = {"reference": "sentencepiece %s (Python)" % spm.__version__, "vocab_size": n,
           "cases": cases, "single": single, "random": rand}
    with open(os.path.join(d, "golden.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(out, ensure_ascii=False) + "\n")
    print("%s: %d pieces, %d lines" % (name, n, len(cases)))


record("sp_bpe", train(model_type="bpe", vocab_size=1500, byte_fallback=True, split_digits=True,
                       remove_extra_whitespaces=False, normalization_rule_name="identity",
                       allow_whitespace_only_pieces=True, character_coverage=0.995,
                       user_defined_symbols=["<tool>"], unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
record("sp_unigram", train(model_type="unigram", vocab_size=1200, character_coverage=0.9995,
                           user_defined_symbols=["[[sep]]"], unk_id=0, bos_id=1, eos_id=2))
