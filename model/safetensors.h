// Safetensors: a reader (mmap, validated header) for single files and HF checkpoint
// directories, and a writer.
//
// File format: 8-byte little-endian header length N, N bytes of JSON
//   {"<tensor>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v"}}
// then the data region; offsets are relative to its start (byte 8 + N).
//
// Guarantees of Open(): every tensor's dtype is F32, F16 or BF16 (else kNotSupported naming
// the tensor and dtype), its byte span equals numel * element size, lies inside the file
// (else kDataLoss: truncated), and no two tensors overlap (kDataLoss). A header length past the
// end of the file is kDataLoss; malformed JSON or fields are kInvalidArgument.
// Views returned by Get() point into the mapping and stay valid while the object lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvstream::model {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
  int64_t numel() const;
};

std::string ShapeToString(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted tensor names.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // kNotFound naming the tensor and the file.
  Result<TensorView> Get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Raw header JSON text (used to derive a checkpoint identity).
  const std::string& header_json() const { return header_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const std::byte* data_ = nullptr;  // start of the data region
  std::string header_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A directory of *.safetensors files: through model.safetensors.index.json when present
// (every file it names must exist and hold the tensors it maps to it), else every
// *.safetensors file in the directory (a tensor name in two files is kInvalidArgument).
class SafetensorsCheckpoint {
 public:
  static Result<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // kNotFound naming the tensor (and the directory).
  Result<TensorView> Get(const std::string& name) const;
  // As Get, plus kInvalidArgument "tensor X: expected shape [a, b], got [c, d]".
  Result<TensorView> GetChecked(const std::string& name, const std::vector<int64_t>& shape) const;
  // Stable hash of every file's header: changes when any tensor's name, dtype, shape or
  // offsets change.
  uint64_t identity() const { return identity_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor -> files_ index
  uint64_t identity_ = 0;
};

// Writer. Each tensor's bytes are produced by `fill` (called once, in order, with a buffer
// of exactly numel * DTypeSize(dtype) bytes) so large checkpoints are written streaming.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::function<Status(std::span<std::byte>)> fill;
};
// Convenience: a tensor whose bytes are already in memory (copied when written).
TensorToWrite TensorFromBytes(std::string name, DType dtype, std::vector<int64_t> shape,
                              std::span<const std::byte> bytes);
// Writes path.tmp then renames it to path. Header padded with spaces to 8-byte alignment.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace kvstream::model
