#include "tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

namespace kvstream::tokenizer {

namespace {

constexpr int64_t kMaxFileBytes = int64_t{1} << 30;

bool IsFile(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<std::string> ReadFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFound("tokenizer file " + path + " does not exist");
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + " is not a regular file");
  if (st.st_size > kMaxFileBytes) return InvalidArgument(path + " is larger than 1 GiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss("reading " + path + " failed");
  return ss.str();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFound("tokenizer path " + path + " does not exist");
  std::string file = path;
  if (S_ISDIR(st.st_mode)) {
    if (IsFile(path + "/tokenizer.json")) {
      file = path + "/tokenizer.json";
    } else if (IsFile(path + "/tokenizer.model")) {
      file = path + "/tokenizer.model";
    } else {
      return NotFound(path + " has neither tokenizer.json nor tokenizer.model");
    }
  }
  KV_ASSIGN_OR_RETURN(std::string bytes, ReadFile(file));
  const bool json = EndsWith(file, ".json") || (!EndsWith(file, ".model") && !bytes.empty() && bytes[0] == '{');
  auto t = json ? FromHfJson(bytes) : FromSentencePiece(bytes);
  if (!t.ok()) return t.status().WithContext(file);
  return t;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::ForModel(const std::string& model) {
  struct stat st {};
  if (::stat(model.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return NotFound("model '" + model + "' is not a checkpoint folder (a preset with dummy weights has no tokenizer)");
  }
  return Load(model);
}

Result<std::string> DecodeStream::Push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> window(ids_.data() + prefix_index_, ids_.size() - prefix_index_);
  KV_ASSIGN_OR_RETURN(std::string text, tok_.Decode(window, skip_special_));
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool incomplete = text.size() >= 3 && text.compare(text.size() - 3, 3, kReplacement) == 0;
  if (text.size() <= prefix_.size() || incomplete || text.compare(0, prefix_.size(), prefix_) != 0) return std::string();
  std::string fresh = text.substr(prefix_.size());
  // The tokens just emitted become the context of the next ones; older ones are dropped.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_index_));
  prefix_index_ = 0;
  read_index_ = ids_.size();
  KV_ASSIGN_OR_RETURN(prefix_, tok_.Decode(ids_, skip_special_));
  return fresh;
}

Result<std::string> DecodeStream::Finish() {
  const std::span<const int32_t> window(ids_.data() + prefix_index_, ids_.size() - prefix_index_);
  KV_ASSIGN_OR_RETURN(std::string text, tok_.Decode(window, skip_special_));
  ids_.clear();
  prefix_index_ = read_index_ = 0;
  std::string old = std::move(prefix_);
  prefix_.clear();
  if (text.size() <= old.size() || text.compare(0, old.size(), old) != 0) return std::string();
  return text.substr(old.size());
}

}  // namespace kvstream::tokenizer
