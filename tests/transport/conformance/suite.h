// The transport conformance suite: one set of TEST_P cases (in_process_cases.h: two transports
// in this process; peer_process_cases.h: the receiver in another process) whose parameter is
// (backend configuration, memory kind). transport_conformance_test instantiates it for host
// memory over the CPU backends, transport_conformance_gpu_test (label gpu) for device and
// managed memory over the GPU backends. A case a configuration cannot run is skipped with the
// reason (GTEST_SKIP), never left out.
//
// Each binary defines the functions declared below (how it makes a configuration's transport
// and the memory of each kind); the cases use nothing else of it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/transport/test_util.h"
#include "transport/transport.h"

namespace kvstream::transport::conformance {

enum class Memory { kHost, kDevice, kManaged };
inline const char* MemoryName(Memory m) {
  return m == Memory::kHost ? "host" : m == Memory::kDevice ? "device" : "managed";
}

struct Config {
  std::string backend;  // the configuration's name (ucx_tcp, ucx_staged_put, ...)
  std::string name;     // the Transport::name() it reports
  Memory memory = Memory::kHost;
  int writer_device = -1;  // CUDA devices of the writer's and the reader's memory (GPU kinds)
  int reader_device = -1;
  TransportOptions options;  // what the binary's MakeTransport may start from
  // Write() refuses a source registration made by another transport of the same backend
  // (cuda_ipc and ucx_staged check only the registration's type: they take it).
  bool refuses_foreign_registration = true;
};
inline std::string ConfigName(const ::testing::TestParamInfo<Config>& info) {
  return info.param.backend + "_" + MemoryName(info.param.memory);
}
inline void PrintTo(const Config& c, std::ostream* os) {
  *os << c.backend << "/" << MemoryName(c.memory);
}

// ---- defined by each binary ----------------------------------------------------------------
// The transport of configuration `c` whose registrations live on `device`.
Result<std::unique_ptr<Transport>> MakeTransport(const Config& c, int device);
// `bytes` of memory of kind `m` on `device`, zeroed; nullptr where this binary has none.
void* AllocateMemory(Memory m, int device, size_t bytes);
void FreeMemory(Memory m, void* p);
// Copies n bytes between any two of the kinds (host included).
void CopyMemory(void* dst, const void* src, size_t n);
int VisibleGpus();
// ---------------------------------------------------------------------------------------------

// Memory of one kind that the suite writes from or into; its bytes are read and written
// through CopyMemory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Memory m, int device, size_t n) : m_(m), device_(device), n_(n) {
    p_ = static_cast<uint8_t*>(AllocateMemory(m, device, n));
  }
  ~Buffer() {
    if (p_ != nullptr) FreeMemory(m_, p_);
  }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(m_, o.m_);
    std::swap(device_, o.device_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  MemoryRegion Region() const {
    if (m_ == Memory::kHost) return MemoryRegion{p_, n_};
    return MemoryRegion{p_, n_, MemoryKind::kCuda, device_};
  }
  std::vector<uint8_t> Read(size_t off, size_t n) const {
    std::vector<uint8_t> out(n);
    if (n > 0) CopyMemory(out.data(), p_ + off, n);
    return out;
  }
  std::vector<uint8_t> Read() const { return Read(0, n_); }
  void Write(size_t off, const void* host, size_t n) { CopyMemory(p_ + off, host, n); }

 private:
  Memory m_ = Memory::kHost;
  int device_ = -1;
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

inline bool SameBytes(const std::vector<uint8_t>& a, size_t a_off, const std::vector<uint8_t>& b,
                      size_t b_off, size_t n) {
  return std::memcmp(a.data() + a_off, b.data() + b_off, n) == 0;
}

class TransportConformance : public ::testing::TestWithParam<Config> {
 protected:
  static constexpr size_t kRegion = 4 << 20;
  static constexpr int32_t kCheckOnArrival = 1;
  static constexpr size_t kChunk = 256 << 10;

  const Config& P() const { return GetParam(); }
  int WriterDevice() const { return P().writer_device; }

  // Skips a configuration this host or this backend cannot run, with the reason.
  void SetUp() override {
    if (P().memory != Memory::kHost) {
      const int need = std::max(P().writer_device, P().reader_device) + 1;
      if (VisibleGpus() < need) {
        GTEST_SKIP() << P().backend << ": needs " << need << " GPU(s), " << VisibleGpus() << " visible";
      }
    }
    auto a = MakeTransport(P(), P().writer_device);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    writer_ = std::move(a).value();
    const Capabilities caps = writer_->capabilities();
    if (P().memory == Memory::kHost && !caps.host_memory) {
      GTEST_SKIP() << P().backend << " moves no host memory (capabilities().host_memory false)";
    }
    if (P().memory != Memory::kHost && !caps.cuda_memory) {
      GTEST_SKIP() << P().backend << " moves no CUDA memory (capabilities().cuda_memory false)";
    }
  }

  // The in-process cases' setup: a reader transport, a source region of kRegion bytes holding
  // a pattern (src_host_ is a host copy of it), a zeroed destination region, an endpoint from
  // the writer to the reader. Skips (with the reason) where the backend registers no memory of
  // this kind.
  void OpenInProcess() {
    auto b = MakeTransport(P(), P().reader_device);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    reader_ = std::move(b).value();
    reader_->SetNotificationSink([this](const Notification& n) { OnNotification(n); });

    src_ = Buffer(P().memory, P().writer_device, kRegion);
    dst_ = Buffer(P().memory, P().reader_device, kRegion);
    ASSERT_NE(src_.data(), nullptr) << "cannot allocate " << MemoryName(P().memory) << " memory";
    ASSERT_NE(dst_.data(), nullptr) << "cannot allocate " << MemoryName(P().memory) << " memory";
    src_host_.assign(kRegion, 0);
    test::FillPattern(src_host_.data(), src_host_.size(), 1);
    src_.Write(0, src_host_.data(), kRegion);
    auto ls = writer_->Register(src_.Region());
    if (!ls.ok() && P().memory == Memory::kManaged) {
      GTEST_SKIP() << P().backend << " registers no managed memory: " << ls.status().ToString();
    }
    ASSERT_TRUE(ls.ok()) << ls.status().ToString();
    local_ = std::move(ls).value();
    auto rd = reader_->Register(dst_.Region());
    ASSERT_TRUE(rd.ok()) << rd.status().ToString();
    remote_ = std::move(rd).value();
    ep_ = Connect();
    ASSERT_NE(ep_, nullptr);
  }

  void TearDown() override {
    ep_.reset();
    if (reader_) reader_->SetNotificationSink(nullptr);
  }

  std::unique_ptr<Endpoint> Connect() {
    PeerDescriptor peer;
    peer.address = reader_->LocalAddress();
    peer.regions.push_back(RemoteRegion{reinterpret_cast<uint64_t>(dst_.data()), dst_.size(),
                                        remote_->RemoteKey()});
    auto ep = test::ConnectAdmitted(*writer_, *reader_, peer);
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    return ep.ok() ? std::move(ep).value() : nullptr;
  }

  // Called on the reader's transport thread: records whether the write's data was already
  // complete when its notification arrived.
  virtual void OnNotification(const Notification& n) {
    if (n.flags == kCheckOnArrival) {
      uint64_t off = static_cast<uint64_t>(n.layer) * kChunk;
      bool ok = SameBytes(dst_.Read(off, kChunk), 0, src_host_, off, kChunk);
      if (!ok) data_missing_at_notification_.fetch_add(1);
    }
    notes_.Push(n);
  }

  WriteRequest Request(std::vector<CopyOp> ops, bool notify = false, Notification n = {}) {
    WriteRequest r;
    r.local = local_.get();
    r.remote_region = 0;
    r.ops = std::move(ops);
    r.notify = notify;
    r.notification = n;
    return r;
  }

  std::unique_ptr<Transport> writer_, reader_;
  Buffer src_, dst_;
  std::vector<uint8_t> src_host_;
  std::unique_ptr<Registration> local_, remote_;
  std::unique_ptr<Endpoint> ep_;
  test::NotificationQueue notes_;
  std::atomic<int> data_missing_at_notification_{0};
};

// Opens the in-process setup; returns from the case when that failed or skipped it.
#define OPEN_IN_PROCESS()                                         \
  do {                                                            \
    ASSERT_NO_FATAL_FAILURE(OpenInProcess());                     \
    if (IsSkipped()) return;                                      \
  } while (0)

inline Deadline Soon() { return DeadlineAfterMs(10000); }

}  // namespace kvstream::transport::conformance
