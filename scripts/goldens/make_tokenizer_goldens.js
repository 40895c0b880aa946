#!/usr/bin/env node
// Trains small tokenizers with Hugging Face `tokenizers` (its Node.js bindings: the same Rust core as
// the Python package) in the exact forms of four model families, and records the reference's
// encodings and decodings of tests/tokenizer/data/corpus.jsonl as goldens (docs/tokenizers.md).
//
//   npm install tokenizers@0.23.2          # in any folder; NODE_PATH=<it>/node_modules
//   node scripts/goldens/make_tokenizer_goldens.js [OUT_DIR]   # default tests/tokenizer/data
//
// Families: llama3 (byte-level BPE, Split regex, ignore_merges, BOS template, string merges),
// qwen2 (NFC, Qwen's regex, array merges, no BOS), llama2 (Prepend+Replace normalizer, byte
// fallback, Sequence[Replace, ByteFallback, Fuse, Strip] decoder), mistral (Metaspace
// pre-tokenizer with prepend_scheme "first", the same decoder, byte fallback). Vocabularies are cut to a
// few thousand so the files stay small; each family also has added tokens with the flags the
// encoder must honour (lstrip, rstrip, single_word, normalized).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const tk = require('tokenizers');

const repo = path.resolve(__dirname, '..', '..');
const outDir = path.resolve(process.argv[2] || path.join(repo, 'tests/tokenizer/data'));
const corpus = fs.readFileSync(path.join(repo, 'tests/tokenizer/data/corpus.jsonl'), 'utf8')
  .split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
const version = require('tokenizers/package.json').version;

// Training text: the corpus many times (every script gets merges) plus English prose and code
// found on any Debian/Ubuntu machine.
function trainingFile() {
  let text = '';
  for (let i = 0; i < 8; i++) text += corpus.join('\n') + '\n';
  for (const f of ['/usr/share/common-licenses/GPL-3', '/usr/share/common-licenses/Apache-2.0']) {
    if (fs.existsSync(f)) text += fs.readFileSync(f, 'utf8');
  }
  const pyDir = fs.readdirSync('/usr/lib').filter((d) => /^python3\.\d+$/.test(d)).sort()[0];
  for (const f of ['textwrap.py', 'json/decoder.py', 'argparse.py']) {
    const p = path.join('/usr/lib', pyDir || 'python3', f);
    if (fs.existsSync(p)) text += fs.readFileSync(p, 'utf8');
  }
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'tokgold-')), 'train.txt');
  fs.writeFileSync(file, text);
  return file;
}

function train(preTokenizer, file) {
  const t = new tk.Tokenizer(tk.BPE.empty());
  t.setPreTokenizer(preTokenizer);
  t.train([file]);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tokgold-'));
  t.save(path.join(dir, 't.json'));
  const j = JSON.parse(fs.readFileSync(path.join(dir, 't.json'), 'utf8'));
  const merges = j.model.merges.map((m) => (Array.isArray(m) ? m : m.split(' ')));
  return { vocab: j.model.vocab, merges };
}

// Keeps `keepChar` characters and the first `nMerges` merges whose parts are kept; ids are laid
// out as `head` tokens, then the alphabet, then the merge results in merge order.
function cut(trained, head, keepChar, nMerges) {
  const vocab = {};
  let next = 0;
  for (const t of head) vocab[t] = next++;
  const alphabet = Object.keys(trained.vocab).filter((t) => [...t].length === 1 && keepChar(t))
    .sort((a, b) => trained.vocab[a] - trained.vocab[b]);
  for (const t of alphabet) if (!(t in vocab)) vocab[t] = next++;
  const merges = [];
  for (const [a, b] of trained.merges) {
    if (merges.length >= nMerges) break;
    if (!(a in vocab) || !(b in vocab) || (a + b) in vocab) continue;
    merges.push([a, b]);
    vocab[a + b] = next++;
  }
  return { vocab, merges, size: next };
}

function added(id, content, special, o = {}) {
  return { id, content, single_word: !!o.single_word, lstrip: !!o.lstrip, rstrip: !!o.rstrip,
           normalized: o.normalized === undefined ? !special : o.normalized, special };
}

function template(bos, bosId) {
  const st = { SpecialToken: { id: bos, type_id: 0 } };
  return {
    type: 'TemplateProcessing',
    single: [st, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [st, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: bos, type_id: 1 } },
           { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
  };
}

const LLAMA3_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function byteLevelFamily(trained, nMerges) {
  const alphabet = tk.byteLevelAlphabet();
  // All 256 byte symbols first, as byte-level vocabularies have them.
  const byteOrder = [];
  for (let b = 0; b < 256; b++) byteOrder.push(byteChar(b));
  return cut(trained, byteOrder, (c) => alphabet.includes(c), nMerges);
}

function byteChar(b) {
  // GPT-2's bytes_to_unicode.
  const keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  if (keep) return String.fromCodePoint(b);
  let n = 0;
  for (let x = 0; x < b; x++) {
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
  }
  return String.fromCodePoint(256 + n);
}

function llama3(trained) {
  const m = byteLevelFamily(trained, 2600);
  let id = m.size;
  const specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>',
                    '<|reserved_special_token_1|>', '<|reserved_special_token_2|>',
                    '<|reserved_special_token_3|>', '<|start_header_id|>', '<|end_header_id|>',
                    '<|reserved_special_token_4|>', '<|eot_id|>'];
  const at = specials.map((s) => added(id++, s, true));
  at.push(added(id++, '<|tool|>', true, { lstrip: true, rstrip: true }));
  at.push(added(id++, '[[sep]]', false, { single_word: true, normalized: false }));
  at.push(added(id++, 'hello world', false, { normalized: true }));
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: at, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: LLAMA3_RE }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      template('<|begin_of_text|>', m.size)] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
             vocab: m.vocab, merges: m.merges.map(([a, b]) => a + ' ' + b) },
  };
}

function qwen2(trained) {
  const m = byteLevelFamily(trained, 2200);
  let id = m.size;
  const at = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'].map((s) => added(id++, s, true));
  at.push(added(id++, '<tool_call>', false, { normalized: false }));
  at.push(added(id++, '</tool_call>', false, { normalized: false }));
  at.push(added(id++, 'Cafe\u0301!', false, { normalized: true }));
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: at,
    normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: QWEN2_RE }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }] },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
             end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false,
             vocab: m.vocab, merges: m.merges },
  };
}

// Llama 2 / Mistral: ids 0-2 are <unk> <s> </s>, 3-258 the byte tokens; characters past the Greek
// and Cyrillic blocks are left out of the alphabet so that they go through byte fallback.
function spmLike(trained) {
  const head = ['<unk>', '<s>', '</s>'];
  for (let b = 0; b < 256; b++) head.push('<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>');
  return cut(trained, head, (c) => c === '\u2581' || c.codePointAt(0) < 0x500, 2400);
}

function llama2(trained) {
  const m = spmLike(trained);
  const at = [added(0, '<unk>', true), added(1, '<s>', true), added(2, '</s>', true),
              added(m.size, 'hello world', false, { normalized: true })];
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: at,
    normalizer: { type: 'Sequence', normalizers: [
      { type: 'Prepend', prepend: '\u2581' },
      { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
    pre_tokenizer: null,
    post_processor: template('<s>', 1),
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true,
             vocab: m.vocab, merges: m.merges.map(([a, b]) => a + ' ' + b) },
  };
}

function mistral(trained) {
  const m = spmLike(trained);
  const at = [added(0, '<unk>', true), added(1, '<s>', true), added(2, '</s>', true),
              added(m.size, '[INST]', true), added(m.size + 1, '[/INST]', true)];
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: at, normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
    post_processor: template('<s>', 1),
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
             vocab: m.vocab, merges: m.merges },
  };
}

// A small deterministic generator for the random id sequences.
function rng(seed) {
  let s = seed >>> 0;
  return () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s; };
}

async function record(name, json) {
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  const text = JSON.stringify(json);
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), text);
  const t = tk.Tokenizer.fromString(text);
  const cases = [];
  for (const line of corpus) {
    const ids = (await t.encode(line, null, { addSpecialTokens: true })).getIds();
    const plain = (await t.encode(line, null, { addSpecialTokens: false })).getIds();
    cases.push({ ids, ids_plain: plain, text: await t.decode(ids, false),
                 text_skip: await t.decode(ids, true) });
  }
  const n = t.getVocabSize(true);
  const single = [];
  for (let i = 0; i < n; i++) single.push(await t.decode([i], false));
  const r = rng(17);
  const random = [];
  for (let k = 0; k < 60; k++) {
    const ids = [];
    const len = 1 + (r() % 12);
    for (let i = 0; i < len; i++) ids.push(r() % n);
    random.push({ ids, text: await t.decode(ids, false) });
  }
  const out = { reference: 'Hugging Face tokenizers ' + version + ' (Node.js bindings)',
                vocab_size: n, cases, single, random };
  fs.writeFileSync(path.join(dir, 'golden.json'), JSON.stringify(out) + '\n');
  console.log(name + ': ' + n + ' tokens, ' + cases.length + ' lines');
}

(async () => {
  const file = trainingFile();
  const bl = train(tk.byteLevelPreTokenizer(false, true), file);
  const ms = train(tk.metaspacePreTokenizer('\u2581', 'first', true), file);
  await record('llama3', llama3(bl));
  await record('qwen2', qwen2(bl));
  await record('llama2', llama2(ms));
  await record('mistral', mistral(ms));
})().catch((e) => { console.error(e); process.exit(1); });
