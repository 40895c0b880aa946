# The reference side of bench/tokenizer_vs_reference.sh with Hugging Face tokenizers' Python
# package (the same Rust core as the Node.js bindings of tokenizer_encode_ref.js): one thread,
# the same file, tokenizer, passes and checksum as bench/tokenizer_encode.cc.
#   TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 python3 bench/tokenizer_encode_ref.py TOKENIZER_JSON TEXT_FILE [SECONDS] [lines|whole]
import json
import sys
import time

import tokenizers


def main():
    tok_path, text_path = sys.argv[1], sys.argv[2]
    min_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    whole = len(sys.argv) > 4 and sys.argv[4] == "whole"
    tok = tokenizers.Tokenizer.from_file(tok_path)
    text = open(text_path, encoding="utf-8", newline="").read()  # no newline translation
    if text.endswith("\n"):
        text = text[:-1]
    lines = [text] if whole else text.split("\n")
    best, total, passes, checksum, ntokens = float("inf"), 0.0, 0, 0, 0
    pass_ = -1
    while pass_ < 1 or total < min_seconds:
        t0 = time.perf_counter()
        # One batch call: with TOKENIZERS_PARALLELISM=false the Rust side encodes it on one thread.
        encs = tok.encode_batch(lines, add_special_tokens=False)
        s = time.perf_counter() - t0
        if pass_ < 0:
            for e in encs:
                for i in e.ids:
                    checksum = (checksum * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
                ntokens += len(e.ids)
        else:
            total += s
            passes += 1
            best = min(best, s)
        pass_ += 1
    nbytes = sum(len(l.encode("utf-8")) for l in lines)
    print(json.dumps({"impl": "tokenizers (python) " + tokenizers.__version__,
                      "mode": "whole" if whole else "lines", "bytes": nbytes, "lines": len(lines),
                      "tokens": ntokens, "passes": passes, "best_s": best,
                      "mb_per_s": nbytes / best / 1e6, "checksum": str(checksum)}))


if __name__ == "__main__":
    main()
