// Fuzzes model::SafetensorsFile::Open (a checkpoint file: header length, JSON header, tensor
// spans). Every tensor of a file it opens must lie inside the mapping: each byte is read.
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvstream::model;
  kvstream::fuzz::MemFile file(std::string_view(reinterpret_cast<const char*>(data), size));
  auto opened = SafetensorsFile::Open(file.path());
  if (!opened.ok()) return 0;
  const SafetensorsFile& f = **opened;
  unsigned sum = 0;
  for (const std::string& name : f.names()) {
    auto view = f.Get(name);
    if (!view.ok()) kvstream::fuzz::Fail("listed tensor not found: " + name);
    if (view->bytes.size() != static_cast<uint64_t>(view->numel()) * DTypeSize(view->dtype))
      kvstream::fuzz::Fail("tensor span differs from its shape: " + name);
    for (std::byte b : view->bytes) sum += static_cast<unsigned>(b);
    (void)ShapeToString(view->shape);
  }
  for (const auto& [k, v] : f.metadata()) sum += k.size() + v.size();
  return static_cast<int>(sum & 0);
}
