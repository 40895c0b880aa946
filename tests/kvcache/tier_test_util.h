// Shared by the KV tier unit tests: a small KV layout and a host tier of so many blocks of it.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "kvcache/host_tier.h"

namespace kvstream::kvcache::testing {

inline model::KvLayout Layout() {
  model::KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.block_size = 4;
  return l;
}

inline std::unique_ptr<HostTier> Host(int blocks, int64_t max_age_s = 0) {
  HostTier::Options o;
  o.layout = Layout();
  o.capacity_bytes = size_t(blocks) * Layout().num_layers * Layout().block_bytes();
  o.max_age_s = max_age_s;
  auto mem = model::AllocateHostPoolMemory(o.capacity_bytes);
  EXPECT_TRUE(mem.ok());
  auto t = HostTier::Create(o, std::move(mem).value());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

}  // namespace kvstream::kvcache::testing
