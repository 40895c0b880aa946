// Fuzzes transport/core's envelope (internal::OpenEnvelope, ReadEnvelopeHead,
// CheckEnvelopePayload) and the payload reader every backend parses its blobs with.
// data[0] picks the case; with bit 0x80 the rest is first sealed with the tag, so the payload
// reader sees valid envelopes too (random bytes rarely pass the checksum).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "transport/core/envelope.h"

namespace {

using namespace kvstream::transport::internal;
constexpr WireTag kTag{{'F', 'U', 'Z', 'Z'}, 3};

// Reads records, byte strings and notifications as `script` says until one does not fit.
void ReadPayload(std::string_view payload, std::string_view script) {
  PayloadReader in(payload);
  size_t consumed = 0;
  for (char op : script) {
    if (in.done()) break;
    bool ok = false;
    switch (static_cast<uint8_t>(op) % 4) {
      case 0: { uint64_t v; ok = in.Record(&v); consumed += ok ? sizeof(v) : 0; break; }
      case 1: { uint8_t v; ok = in.Record(&v); consumed += ok ? sizeof(v) : 0; break; }
      case 2: {
        std::string_view b;
        ok = in.Bytes(&b);
        if (ok && (b.data() < payload.data() || b.data() + b.size() > payload.data() + payload.size()))
          kvstream::fuzz::Fail("Bytes() points outside the payload");
        consumed += ok ? 4 + b.size() : 0;
        break;
      }
      case 3: {
        kvstream::transport::Notification n;
        ok = ReadNotification(in, &n);
        consumed += ok ? 24 : 0;
        break;
      }
    }
    if (!ok) break;
  }
  if (consumed > payload.size()) kvstream::fuzz::Fail("read past the payload");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const uint8_t script_len = data[1] % 32;
  std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::string_view script = rest.substr(0, std::min<size_t>(script_len, rest.size()));
  rest.remove_prefix(script.size());
  std::string sealed;
  if (mode & 0x80) {
    sealed = SealEnvelope(kTag, mode & 0x7, rest);
    // Sealed, it must open; cut short by one byte it must not (exact mode).
    auto e = OpenEnvelope(kTag, sealed, "sealed");
    if (!e.ok() || e->payload != rest || e->type != (mode & 0x7))
      kvstream::fuzz::Fail("a sealed envelope does not open to its payload");
    if (OpenEnvelope(kTag, std::string_view(sealed).substr(0, sealed.size() - 1), "cut").ok())
      kvstream::fuzz::Fail("a cut envelope opened");
    rest = sealed;
  }
  switch (mode & 0x3) {
    case 0:
    case 1: {
      auto e = OpenEnvelope(kTag, rest, "fuzz blob", /*exact=*/(mode & 0x1) == 0);
      if (e.ok()) ReadPayload(e->payload, script);
      break;
    }
    case 2: {
      if (rest.size() < sizeof(EnvelopeHead)) break;
      auto head = ReadEnvelopeHead(kTag, rest.data(), 1 << 20, "fuzz stream");
      if (!head.ok()) break;
      std::string_view payload = rest.substr(sizeof(EnvelopeHead));
      if (CheckEnvelopePayload(*head, payload, "fuzz stream").ok() && payload.size() != head->length)
        kvstream::fuzz::Fail("payload of the wrong length accepted");
      break;
    }
    case 3:
      ReadPayload(rest, script);
      break;
  }
  return 0;
}
