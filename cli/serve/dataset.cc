#include "cli/serve/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

namespace kvstream::cli::serve {

using json = nlohmann::json;

namespace {

// Common short English words: most are one token with a leading space in BPE vocabularies.
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "world", "life", "hand", "part", "child", "eye", "place", "work",
    "week", "case", "point", "number", "group", "fact", "good", "new", "first", "last", "long",
    "great", "little", "own", "other", "old", "right", "big", "high", "small", "large", "next",
    "early", "young", "few", "public", "bad", "same", "able", "city", "water", "house", "light",
    "river", "stone", "music", "paper", "money", "story", "road", "tree", "game", "sun", "sea"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

struct Lens {
  std::uniform_int_distribution<int> in, out;
};
Lens MakeLens(const DatasetOptions& o) {
  const int in_lo = static_cast<int>(std::floor(o.input_len * (1 - o.range_ratio)));
  const int in_hi = static_cast<int>(std::ceil(o.input_len * (1 + o.range_ratio)));
  const int out_lo = std::max(1, static_cast<int>(std::floor(o.output_len * (1 - o.range_ratio))));
  const int out_hi = std::max(out_lo, static_cast<int>(std::ceil(o.output_len * (1 + o.range_ratio))));
  return {std::uniform_int_distribution<int>(std::max(1, in_lo), std::max(1, in_hi)),
          std::uniform_int_distribution<int>(out_lo, out_hi)};
}

// `n` tokens: ids (offset + index + j) % vocab, or n words.
Message RandomMessage(const DatasetOptions& o, int n, int index, std::mt19937_64& rng) {
  Message m;
  if (o.ids) {
    const int offset = std::uniform_int_distribution<int>(0, o.vocab_size - 1)(rng);
    for (int j = 0; j < n; ++j) m.ids.push_back(static_cast<int32_t>((int64_t(offset) + index + j) % o.vocab_size));
  } else {
    std::uniform_int_distribution<int> word(0, kNumWords - 1);
    for (int j = 0; j < n; ++j) {
      m.text += ' ';
      m.text += kWords[word(rng)];
    }
  }
  return m;
}

Result<std::vector<Conversation>> Jsonl(const DatasetOptions& o) {
  std::ifstream in(o.path);
  if (!in) return InvalidArgument("--dataset-path: cannot read " + o.path);
  std::vector<Conversation> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.path + ":" + std::to_string(n) + ": ";
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt"))
      return InvalidArgument(where + "not a JSON object with a \"prompt\"");
    Conversation c;
    Turn t;
    const json& p = j["prompt"];
    if (p.is_string()) {
      t.user.text = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
      c.ids = true;
      t.user.ids = p.get<std::vector<int32_t>>();
    } else {
      return InvalidArgument(where + "\"prompt\" must be a string or a non-empty list of token ids");
    }
    t.max_tokens = o.output_len;
    if (j.contains("max_tokens")) {
      if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1)
        return InvalidArgument(where + "\"max_tokens\" must be a positive integer");
      t.max_tokens = j["max_tokens"].get<int>();
    }
    c.turns.push_back(std::move(t));
    out.push_back(std::move(c));
    if (o.num_prompts > 0 && int(out.size()) == o.num_prompts) break;
  }
  if (out.empty()) return InvalidArgument("--dataset-path " + o.path + " holds no prompt");
  // Fewer lines than --num-prompts: cycle through them, as vLLM oversamples.
  for (size_t i = 0; int(out.size()) < o.num_prompts; ++i) out.push_back(out[i]);
  return out;
}

}  // namespace

Result<std::vector<Conversation>> MakeDataset(const DatasetOptions& o) {
  if (o.kind == "jsonl") {
    if (o.path.empty()) return InvalidArgument("--dataset jsonl needs --dataset-path");
    return Jsonl(o);
  }
  if (o.kind != "random" && o.kind != "multiturn")
    return InvalidArgument("--dataset: unknown '" + o.kind + "' (have: random, jsonl, multiturn)");
  if (o.range_ratio < 0 || o.range_ratio >= 1) return InvalidArgument("--range-ratio must be in [0, 1)");
  if (o.ids && o.vocab_size <= 0) return InvalidArgument("--prompt-format ids needs --vocab-size");
  std::mt19937_64 rng(o.seed);
  Lens lens = MakeLens(o);
  std::vector<Conversation> out;
  if (o.kind == "random") {
    for (int i = 0; i < o.num_prompts; ++i) {
      Conversation c;
      c.ids = o.ids;
      const int n = lens.in(rng);
      Turn t{RandomMessage(o, n, i, rng), lens.out(rng)};
      c.turns.push_back(std::move(t));
      out.push_back(std::move(c));
    }
    return out;
  }
  const Message system = RandomMessage(o, o.system_len, 0, rng);
  for (int i = 0; i < o.conversations; ++i) {
    Conversation c;
    c.ids = o.ids;
    c.system = o.system_len > 0 ? system : Message{};
    for (int t = 0; t < o.turns; ++t) {
      const int n = lens.in(rng);
      Turn turn{RandomMessage(o, n, i * o.turns + t + 1, rng), lens.out(rng)};
      c.turns.push_back(std::move(turn));
    }
    out.push_back(std::move(c));
  }
  return out;
}

namespace {
int Words(const std::string& s) {
  int n = 0;
  bool in = false;
  for (char ch : s) {
    const bool sp = ch == ' ' || ch == '\n' || ch == '\t';
    if (!sp && !in) ++n;
    in = !sp;
  }
  return n;
}
}  // namespace

Message TurnPrompt(const Conversation& c, size_t turn, const std::vector<Message>& answers, int* prompt_len) {
  Message p = c.system;
  for (size_t t = 0; t < turn; ++t) {
    p.ids.insert(p.ids.end(), c.turns[t].user.ids.begin(), c.turns[t].user.ids.end());
    p.text += c.turns[t].user.text;
    if (t < answers.size()) {
      p.ids.insert(p.ids.end(), answers[t].ids.begin(), answers[t].ids.end());
      p.text += answers[t].text;
    }
  }
  p.ids.insert(p.ids.end(), c.turns[turn].user.ids.begin(), c.turns[turn].user.ids.end());
  p.text += c.turns[turn].user.text;
  *prompt_len = c.ids ? static_cast<int>(p.ids.size()) : Words(p.text);
  return p;
}

std::string RequestBody(const Conversation& c, size_t turn, const std::vector<Message>& answers,
                        const BodyOptions& o, int* prompt_len) {
  json body = json::object();
  body["model"] = o.model;
  if (o.chat) {
    json msgs = json::array();
    int words = 0;
    auto add = [&](const char* role, const std::string& text) {
      msgs.push_back({{"role", role}, {"content", text}});
      words += Words(text);
    };
    if (!c.system.text.empty()) add("system", c.system.text);
    for (size_t t = 0; t < turn; ++t) {
      add("user", c.turns[t].user.text);
      add("assistant", t < answers.size() ? answers[t].text : std::string());
    }
    add("user", c.turns[turn].user.text);
    body["messages"] = std::move(msgs);
    *prompt_len = words;
  } else if (c.ids) {
    body["prompt"] = TurnPrompt(c, turn, answers, prompt_len).ids;
    if (c.turns.size() > 1) body["return_token_ids"] = true;
  } else {
    body["prompt"] = TurnPrompt(c, turn, answers, prompt_len).text;
  }
  body["max_tokens"] = c.turns[turn].max_tokens;
  body["temperature"] = o.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (!o.load_mode.empty()) body["load_mode"] = o.load_mode;
  for (const auto& [k, v] : o.extra.items()) body[k] = v;
  return body.dump();
}

}  // namespace kvstream::cli::serve
