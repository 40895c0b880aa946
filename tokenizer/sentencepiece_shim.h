// The C interface of libkvstream_sentencepiece.so, a thin shim over Debian's libsentencepiece.
//
// Why a shim: libsentencepiece carries its own copy of protobuf 3.14's runtime with exported
// symbols, which clash with the system libprotobuf (3.21) that gRPC brings: a process that links
// both aborts at start-up. sp_tokenizer.cc loads this shim with dlmopen() into a link namespace
// of its own, so the two never meet. Only plain C types and caller-owned buffers cross the
// boundary (the namespaces have separate heaps).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct kv_spm;

// nullptr on error, with the message in err (NUL-terminated, truncated to errcap).
kv_spm* kv_spm_load(const char* model, size_t model_len, char* err, size_t errcap);
void kv_spm_free(kv_spm* sp);
int32_t kv_spm_piece_size(const kv_spm* sp);
int32_t kv_spm_bos_id(const kv_spm* sp);
int kv_spm_is_control(const kv_spm* sp, int32_t id);
// The number of ids (written up to cap; call again with a larger buffer when it is larger),
// or -1 with the message in err.
int64_t kv_spm_encode(const kv_spm* sp, const char* text, size_t len, int32_t* ids, size_t cap,
                      char* err, size_t errcap);
// The length of the text (written up to cap, not NUL-terminated), or -1 with the message in err.
int64_t kv_spm_decode(const kv_spm* sp, const int32_t* ids, size_t n, char* out, size_t cap,
                      char* err, size_t errcap);

}  // extern "C"
