// An in-process transport for logic tests of the daemons and the connector: it copies with
// memcpy into the peer Transport's registered memory (the peer must live in the same process;
// CreateTransport({.backend = "fake"}) makes one) and delivers notifications after the copy,
// like a real backend. It keeps every guarantee of transport.h, and adds fault injection.
//
// Writes run in order on one thread per FakeTransport (the writer's), so a delay holds back
// the writes posted after it as well.
//
// Addresses are "fake:<n>", memory keys "fake:<n>:<m>"; they mean nothing outside the process.
#pragma once

#include <chrono>
#include <memory>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::testing {

class FakeTransport : public Transport {
 public:
  static std::unique_ptr<FakeTransport> Create();

  // Fault injection (thread-safe; effective for writes that start afterwards):
  // The n-th write started from now on (1 = the next one) fails with `status` without copying.
  virtual void FailNthWrite(int n, Status status) = 0;
  // Every write waits this long before it copies (0 = none).
  virtual void SetWriteDelay(std::chrono::microseconds delay) = 0;
  // Simulates losing this transport (a crashed process, a cut link): from now on every endpoint
  // from it or to it reports kRemoteDisconnect, writes queued or later fail with it, and
  // nothing more lands in its memory nor leaves it.
  virtual void Disconnect() = 0;
  // Writes started from now on whose notification names `layer` (kAnyLayer: every layer)
  // copy their data and complete, but deliver no notification to the peer (a notification
  // lost or never sent); kNoLayer ends it.
  static constexpr int kAnyLayer = -1;
  static constexpr int kNoLayer = -2;
  virtual void DropNotifications(int layer) = 0;
  // Writes started over this transport's endpoints so far; for assertions.
  virtual uint64_t writes_started() const = 0;
};

Result<std::unique_ptr<Transport>> CreateFakeTransport(const TransportOptions& options);

}  // namespace kvstream::transport::testing
