#include "tokenizer/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

struct kv_spm {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {
void SetError(char* err, size_t cap, const std::string& msg) {
  if (cap > 0) std::snprintf(err, cap, "%s", msg.c_str());
}
}  // namespace

extern "C" {

kv_spm* kv_spm_load(const char* model, size_t model_len, char* err, size_t errcap) {
  auto* h = new (std::nothrow) kv_spm();
  if (h == nullptr) return nullptr;
  const auto st = h->sp.LoadFromSerializedProto(std::string_view(model, model_len));
  if (!st.ok()) {
    SetError(err, errcap, st.ToString());
    delete h;
    return nullptr;
  }
  return h;
}

void kv_spm_free(kv_spm* sp) { delete sp; }
int32_t kv_spm_piece_size(const kv_spm* sp) { return sp->sp.GetPieceSize(); }
int32_t kv_spm_bos_id(const kv_spm* sp) { return sp->sp.bos_id(); }
int kv_spm_is_control(const kv_spm* sp, int32_t id) { return sp->sp.IsControl(id) ? 1 : 0; }

int64_t kv_spm_encode(const kv_spm* sp, const char* text, size_t len, int32_t* ids, size_t cap,
                      char* err, size_t errcap) {
  try {
    std::vector<int> v;
    const auto st = sp->sp.Encode(std::string_view(text, len), &v);
    if (!st.ok()) {
      SetError(err, errcap, st.ToString());
      return -1;
    }
    for (size_t i = 0; i < v.size() && i < cap; ++i) ids[i] = v[i];
    return static_cast<int64_t>(v.size());
  } catch (const std::exception& e) {
    SetError(err, errcap, e.what());
    return -1;
  }
}

int64_t kv_spm_decode(const kv_spm* sp, const int32_t* ids, size_t n, char* out, size_t cap,
                      char* err, size_t errcap) {
  try {
    const std::vector<int> v(ids, ids + n);
    std::string text;
    const auto st = sp->sp.Decode(v, &text);
    if (!st.ok()) {
      SetError(err, errcap, st.ToString());
      return -1;
    }
    std::memcpy(out, text.data(), std::min(cap, text.size()));
    return static_cast<int64_t>(text.size());
  } catch (const std::exception& e) {
    SetError(err, errcap, e.what());
    return -1;
  }
}

}  // extern "C"
