// The reference side of bench/tokenizer_vs_reference.sh: Hugging Face tokenizers (Node.js bindings, the same
// Rust core as the Python package), one thread, the same file, tokenizer and checksum as
// bench/tokenizer_encode.cc.
//   TOKENIZERS_PARALLELISM=false node bench/tokenizer_encode_ref.js TOKENIZER_JSON TEXT_FILE [SECONDS] [lines|whole]
'use strict';
const fs = require('fs');
const tk = require('tokenizers');

(async () => {
  const [tokPath, textPath, secs, mode] = process.argv.slice(2);
  const whole = mode === 'whole';
  const minSeconds = secs ? Number(secs) : 3;
  const tok = tk.Tokenizer.fromFile(tokPath);
  const raw = fs.readFileSync(textPath);
  let text = raw.toString('utf8');
  if (text.endsWith('\n')) text = text.slice(0, -1);
  const lines = whole ? [text] : text.split('\n');
  let best = Infinity, total = 0, passes = 0, checksum = 0n, tokens = 0;
  for (let pass = -1; pass < 1 || total < minSeconds; pass++) {
    const t0 = process.hrtime.bigint();
    // One batch call: with TOKENIZERS_PARALLELISM=false the Rust side encodes it on one thread.
    const encs = await tok.encodeBatch(lines, { addSpecialTokens: false });
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (pass < 0) {
      let sum = 0n, n = 0;
      for (const e of encs) {
        for (const id of e.getIds()) sum = (sum * 1000003n + BigInt(id)) & 0xFFFFFFFFFFFFFFFFn;
        n += e.getLength();
      }
      checksum = sum;
      tokens = n;
      continue;
    }
    total += s;
    passes++;
    best = Math.min(best, s);
  }
  const bytes = lines.reduce((a, l) => a + Buffer.byteLength(l), 0);
  console.log(JSON.stringify({ impl: 'tokenizers ' + require('tokenizers/package.json').version,
                               mode: whole ? 'whole' : 'lines',
                               bytes, lines: lines.length, tokens, passes, best_s: best,
                               mb_per_s: bytes / best / 1e6, checksum: checksum.toString() }));
})().catch((e) => { console.error(e); process.exit(1); });
