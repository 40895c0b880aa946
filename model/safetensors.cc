#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace kvstream::model {
namespace {

using nlohmann::json;

std::string SafetensorsDTypeName(DType d) {
  return d == DType::kF32 ? "F32" : (d == DType::kF16 ? "F16" : "BF16");
}

// Header larger than this is refused: no real checkpoint comes near it, and it bounds what a
// corrupt length can make us read.
constexpr uint64_t kMaxHeader = 100ull << 20;

std::string ReadTextFile(const std::string& path, Status* status) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *status = NotFound("cannot open " + path);
    return {};
  }
  std::stringstream ss;
  ss << f.rdbuf();
  *status = OkStatus();
  return ss.str();
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(f->fd_, &st) != 0) return Internal("fstat " + path + ": " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto err = [&](Status s) { return s.WithContext(path); };
  if (size < 8)
    return err(DataLoss("truncated: file is " + std::to_string(size) +
                        " bytes, shorter than the 8-byte header length"));
  f->map_size_ = size;
  f->map_ = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    return Internal("mmap " + path + ": " + std::strerror(errno));
  }
  const auto* base = static_cast<const unsigned char*>(f->map_);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(base[i]) << (8 * i);
  if (n > size - 8)
    return err(DataLoss("truncated: header length " + std::to_string(n) +
                        " runs past the end of the file (" + std::to_string(size) + " bytes)"));
  if (n > kMaxHeader)
    return err(InvalidArgument("header length " + std::to_string(n) + " exceeds 100 MiB"));
  f->header_.assign(reinterpret_cast<const char*>(base + 8), n);
  f->data_ = reinterpret_cast<const std::byte*>(base + 8 + n);
  const uint64_t data_size = size - 8 - n;

  json j = json::parse(f->header_, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return err(InvalidArgument("header is not valid JSON"));
  if (!j.is_object()) return err(InvalidArgument("header JSON is not an object"));

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return err(InvalidArgument("__metadata__ is not an object"));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return err(InvalidArgument("__metadata__ value of '" + m.key() + "' is not a string"));
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return err(InvalidArgument("tensor '" + name + "': " + what));
    };
    if (!v.is_object()) return bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("missing string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) return bad("missing array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
        !v["data_offsets"][1].is_number_unsigned())
      return bad("'data_offsets' must be two non-negative integers");
    Entry e;
    std::string dt = v["dtype"].get<std::string>();
    if (dt == "F32") e.dtype = DType::kF32;
    else if (dt == "F16") e.dtype = DType::kF16;
    else if (dt == "BF16") e.dtype = DType::kBF16;
    else
      return err(NotSupported("tensor '" + name + "' has dtype " + dt +
                              "; supported: F32, F16, BF16"));
    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
      uint64_t x = d.get<uint64_t>();
      if (x != 0 && numel > (uint64_t(1) << 62) / x) return bad("shape overflows");
      numel *= x;
      e.shape.push_back(static_cast<int64_t>(x));
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.end < e.begin) return bad("data_offsets end < begin");
    const uint64_t need = numel * DTypeSize(e.dtype);
    if (e.end - e.begin != need)
      return bad("data_offsets span " + std::to_string(e.end - e.begin) + " bytes but shape " +
                 ShapeToString(e.shape) + " of " + dt + " needs " + std::to_string(need));
    if (e.end > data_size)
      return err(DataLoss("truncated: tensor '" + name + "' ends at data byte " +
                          std::to_string(e.end) + " but the file holds only " +
                          std::to_string(data_size) + " data bytes"));
    f->tensors_.emplace(name, std::move(e));
  }
  // Overlap check over the tensors sorted by start offset (empty tensors never overlap).
  std::vector<std::pair<const std::string*, const Entry*>> by_off;
  for (const auto& [name, e] : f->tensors_)
    if (e.end > e.begin) by_off.push_back({&name, &e});
  std::sort(by_off.begin(), by_off.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_off.size(); ++i) {
    if (by_off[i].second->begin < by_off[i - 1].second->end)
      return err(DataLoss("tensors '" + *by_off[i - 1].first + "' and '" + *by_off[i].first +
                          "' overlap"));
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : tensors_) out.push_back(n);
  return out;
}

Result<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return NotFound("tensor '" + name + "' not found in " + path_);
  const Entry& e = it->second;
  TensorView v;
  v.name = name;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.bytes = std::span<const std::byte>(data_ + e.begin, e.end - e.begin);
  return v;
}

Result<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("checkpoint directory " + dir + " does not exist");
  auto ck = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
  ck->dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  std::map<std::string, std::string> index_map;  // tensor -> file
  if (fs::exists(index_path, ec)) {
    Status st;
    std::string text = ReadTextFile(index_path.string(), &st);
    KV_RETURN_IF_ERROR(st);
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      return InvalidArgument(index_path.string() + ": not JSON with a 'weight_map' object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return InvalidArgument(index_path.string() + ": weight_map value of '" + it.key() +
                               "' is not a string");
      std::string file = it.value().get<std::string>();
      // A file name inside the checkpoint folder: no directories, no way out of it.
      if (file.find_first_of(std::string("/\\\0", 3)) != std::string::npos || file == ".." ||
          file == "." || file.empty())
        return InvalidArgument(index_path.string() + ": bad file name '" + file + "'");
      index_map[it.key()] = file;
      if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
    }
    std::sort(files.begin(), files.end());
  } else {
    for (const auto& de : fs::directory_iterator(dir, ec)) {
      if (de.path().extension() == ".safetensors") files.push_back(de.path().filename().string());
    }
    if (ec) return Internal("listing " + dir + ": " + ec.message());
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) return NotFound("no *.safetensors files in " + dir);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& name : files) {
    KV_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((fs::path(dir) / name).string()));
    for (unsigned char c : f->header_json()) h = (h ^ c) * 0x100000001b3ULL;
    const size_t idx = ck->files_.size();
    // No tensor twice, with or without an index (which copy is meant would be a guess).
    for (const auto& t : f->names()) {
      auto [it, inserted] = ck->where_.emplace(t, idx);
      if (!inserted)
        return InvalidArgument("tensor '" + t + "' is in both " + ck->files_[it->second]->path() +
                               " and " + f->path());
    }
    ck->files_.push_back(std::move(f));
  }
  for (const auto& [tensor, file] : index_map) {
    size_t idx = std::lower_bound(files.begin(), files.end(), file) - files.begin();
    if (!ck->files_[idx]->contains(tensor))
      return DataLoss("index maps tensor '" + tensor + "' to " + file + ", which does not hold it");
    ck->where_[tensor] = idx;
  }
  ck->identity_ = h;
  return ck;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

Result<TensorView> SafetensorsCheckpoint::Get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return NotFound("tensor '" + name + "' not found in checkpoint " + dir_);
  return files_[it->second]->Get(name);
}

Result<TensorView> SafetensorsCheckpoint::GetChecked(const std::string& name,
                                                     const std::vector<int64_t>& shape) const {
  KV_ASSIGN_OR_RETURN(TensorView v, Get(name));
  if (v.shape != shape)
    return InvalidArgument("tensor '" + name + "': expected shape " + ShapeToString(shape) +
                           ", got " + ShapeToString(v.shape));
  return v;
}

TensorToWrite TensorFromBytes(std::string name, DType dtype, std::vector<int64_t> shape,
                              std::span<const std::byte> bytes) {
  TensorToWrite t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.fill = [bytes](std::span<std::byte> dst) -> Status {
    if (dst.size() != bytes.size())
      return InvalidArgument("tensor bytes (" + std::to_string(bytes.size()) +
                             ") do not match its shape and dtype (" +
                             std::to_string(dst.size()) + ")");
    // An empty tensor may have no buffer at all: memcpy from or to null is undefined.
    if (!bytes.empty()) std::memcpy(dst.data(), bytes.data(), bytes.size());
    return OkStatus();
  };
  return t;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return InvalidArgument("bad tensor name '" + t.name + "'");
    if (header.contains(t.name)) return InvalidArgument("duplicate tensor '" + t.name + "'");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgument("tensor '" + t.name + "': negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    uint64_t bytes = numel * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", SafetensorsDTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Unavailable("cannot create " + tmp + ": " + std::strerror(errno));
  auto fail = [&](Status s) {
    std::fclose(f);
    std::remove(tmp.c_str());
    return s;
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(text.data(), 1, text.size(), f) != text.size())
    return fail(Unavailable("writing " + tmp + ": " + std::strerror(errno)));
  std::vector<std::byte> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buf.assign(sizes[i], std::byte{0});
    if (tensors[i].fill) {
      Status s = tensors[i].fill(std::span<std::byte>(buf));
      if (!s.ok()) return fail(s.WithContext("tensor '" + tensors[i].name + "'"));
    }
    if (std::fwrite(buf.data(), 1, buf.size(), f) != buf.size())
      return fail(Unavailable("writing " + tmp + ": " + std::strerror(errno)));
  }
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    return Unavailable("closing " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Unavailable("renaming " + tmp + " to " + path + ": " + std::strerror(errno));
  return OkStatus();
}

}  // namespace kvstream::model
