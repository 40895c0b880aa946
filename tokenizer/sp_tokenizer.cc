// SentencePiece .model files through Debian's libsentencepiece, reached through
// libkvstream_sentencepiece.so in a link namespace of its own (tokenizer/sentencepiece_shim.h says
// why).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "tokenizer/sentencepiece_shim.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvstream::tokenizer {

namespace {

constexpr const char* kShimName = "libkvstream_sentencepiece.so";

struct Shim {
  decltype(&kv_spm_load) load = nullptr;
  decltype(&kv_spm_free) free = nullptr;
  decltype(&kv_spm_piece_size) piece_size = nullptr;
  decltype(&kv_spm_bos_id) bos_id = nullptr;
  decltype(&kv_spm_is_control) is_control = nullptr;
  decltype(&kv_spm_encode) encode = nullptr;
  decltype(&kv_spm_decode) decode = nullptr;
};

std::string ExeDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// Loaded once per process: KVSTREAM_SENTENCEPIECE_LIB, else lib/ beside the binary's bin/, else
// the binary's folder, else the loader's search path.
Result<const Shim*> GetShim() {
  static Shim shim;
  static Status status = [] {
    std::vector<std::string> tries;
    if (const char* env = std::getenv("KVSTREAM_SENTENCEPIECE_LIB"); env != nullptr && *env != '\0') {
      tries.push_back(env);
    } else {
      const std::string dir = ExeDir();
      tries = {dir + "/../lib/" + kShimName, dir + "/" + kShimName, kShimName};
    }
    void* lib = nullptr;
    std::string errors;
    for (const auto& path : tries) {
      lib = ::dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* e = ::dlerror();
      errors += "\n  " + path + ": " + (e ? e : "not loaded");
    }
    if (lib == nullptr) {
      return NotFound(std::string("SentencePiece models need ") + kShimName +
                      " (built into lib/ beside bin/; or set KVSTREAM_SENTENCEPIECE_LIB):" + errors);
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    sym(shim.load, "kv_spm_load");
    sym(shim.free, "kv_spm_free");
    sym(shim.piece_size, "kv_spm_piece_size");
    sym(shim.bos_id, "kv_spm_bos_id");
    sym(shim.is_control, "kv_spm_is_control");
    sym(shim.encode, "kv_spm_encode");
    sym(shim.decode, "kv_spm_decode");
    return ok ? OkStatus() : Internal(std::string(kShimName) + " lacks a kv_spm_* function");
  }();
  if (!status.ok()) return status;
  return &shim;
}

class SpTokenizer : public Tokenizer {
 public:
  ~SpTokenizer() override {
    if (sp_ != nullptr) shim_->free(sp_);
  }
  Status Init(std::string_view proto) {
    KV_ASSIGN_OR_RETURN(shim_, GetShim());
    char err[512] = {0};
    sp_ = shim_->load(proto.data(), proto.size(), err, sizeof(err));
    if (sp_ == nullptr) return InvalidArgument(std::string("tokenizer.model: ") + err);
    size_ = shim_->piece_size(sp_);
    if (size_ <= 0) return InvalidArgument("tokenizer.model has no pieces");
    bos_ = shim_->bos_id(sp_);
    if (bos_ >= size_) bos_ = -1;
    control_.resize(static_cast<size_t>(size_));
    for (int32_t i = 0; i < size_; ++i) control_[i] = shim_->is_control(sp_, i) != 0;
    return OkStatus();
  }
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special) const override {
    if (!IsValidUtf8(text)) return InvalidArgument("text to encode is not valid UTF-8");
    std::vector<int32_t> out;
    // Llama 2 and Mistral prepend BOS, as Hugging Face's LlamaTokenizer does by default.
    const size_t head = add_special && bos_ >= 0 ? 1 : 0;
    out.resize(head + text.size() + 16);
    char err[512] = {0};
    int64_t n = shim_->encode(sp_, text.data(), text.size(), out.data() + head, out.size() - head, err, sizeof(err));
    if (n >= 0 && static_cast<size_t>(n) > out.size() - head) {
      out.resize(head + static_cast<size_t>(n));
      n = shim_->encode(sp_, text.data(), text.size(), out.data() + head, out.size() - head, err, sizeof(err));
    }
    if (n < 0) return InvalidArgument(std::string("sentencepiece encode: ") + err);
    out.resize(head + static_cast<size_t>(n));
    if (head) out[0] = bos_;
    return out;
  }
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::vector<int32_t> v;
    v.reserve(ids.size());
    for (const int32_t id : ids) {
      if (id < 0 || id >= size_) return InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary");
      if (skip_special && control_[id]) continue;
      v.push_back(id);
    }
    std::string text(v.size() * 8 + 64, '\0');
    char err[512] = {0};
    int64_t n = shim_->decode(sp_, v.data(), v.size(), text.data(), text.size(), err, sizeof(err));
    if (n >= 0 && static_cast<size_t>(n) > text.size()) {
      text.resize(static_cast<size_t>(n));
      n = shim_->decode(sp_, v.data(), v.size(), text.data(), text.size(), err, sizeof(err));
    }
    if (n < 0) return InvalidArgument(std::string("sentencepiece decode: ") + err);
    text.resize(static_cast<size_t>(n));
    return text;
  }
  int32_t vocab_size() const override { return size_; }
  bool IsSpecial(int32_t id) const override { return id >= 0 && id < size_ && control_[id]; }
  std::string Describe() const override { return "sentencepiece (" + std::to_string(size_) + " pieces)"; }

 private:
  const Shim* shim_ = nullptr;
  kv_spm* sp_ = nullptr;
  int32_t size_ = 0;
  int32_t bos_ = -1;
  std::vector<bool> control_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromSentencePiece(std::string_view model_proto) {
  auto t = std::make_unique<SpTokenizer>();
  KV_RETURN_IF_ERROR(t->Init(model_proto));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace kvstream::tokenizer
