#include "kvcache/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <vector>

#include "common/log.h"

namespace kvstream::kvcache {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kSuffix = ".kvb";
constexpr std::string_view kTempPrefix = ".tmp-";

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// A file's bytes in a buffer aligned for O_DIRECT (not zero-filled first).
constexpr size_t kDirectAlign = 4096;
struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t(kDirectAlign)); }
};
// Each thread's buffer, kept between its reads and writes (so neither allocates nor faults in
// fresh pages): the size of the largest file it read or wrote, an entry (every layer of one
// block). Its bytes are valid until the thread's next ReadFile or Put.
std::byte* ThreadBuffer(size_t bytes) {
  thread_local std::unique_ptr<std::byte, AlignedFree> buf;
  thread_local size_t capacity = 0;
  if (capacity < bytes) {
    buf.reset();
    buf.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t(kDirectAlign))));
    capacity = bytes;
  }
  return buf.get();
}

// Reads up to `limit` bytes of the file (the whole file when limit is 0) into this thread's
// buffer: valid until the thread's next ReadFile. `direct`: with O_DIRECT (whole aligned pieces
// into the aligned buffer, bypassing the page cache), falling back to buffered reads where the
// file system refuses it or a read ends short mid-file.
Result<std::span<const std::byte>> ReadFile(const std::string& path, size_t limit, bool direct) {
  int fd = direct ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
  if (fd < 0) {
    direct = false;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) return NotFound(Errno("open " + path));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return DataLoss(path + ": not a regular file");
  }
  size_t want = size_t(st.st_size);
  if (limit != 0) want = std::min(want, limit);
  const size_t room = std::max<size_t>(kDirectAlign, (want + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
  std::byte* const buf = ThreadBuffer(room);
  size_t done = 0;
  while (done < want) {
    // O_DIRECT reads whole aligned pieces (the last one ends at the end of the file).
    const size_t ask = direct ? room - done : want - done;
    const ssize_t n = ::pread(fd, buf + done, ask, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (direct && (n < 0 || (size_t(n) % kDirectAlign != 0 && done + size_t(n) < want))) {
      // Refused, or short mid-file: the rest buffered (a short piece was read whole: keep it).
      if (n > 0) done += size_t(n);
      direct = false;
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
      continue;
    }
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  return std::span<const std::byte>(buf, std::min(done, want));
}

bool ParseKeyHex(std::string_view hex, BlockKey* key) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else return false;
    }
    (*key)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

}  // namespace

DiskTier::DiskTier(const Options& options)
    : options_(options),
      index_({options.capacity_bytes, options.low_watermark, options.max_age_s}) {
  stats_.capacity_bytes = options_.capacity_bytes;
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const Options& options) {
  if (options.dir.empty()) return InvalidArgument("disk KV tier: no directory");
  if (options.secret.size() < kMinSecretBytes)
    return InvalidArgument("disk KV tier: needs the cluster secret (kv_tier_secret_file)");
  if (options.capacity_bytes < EncodedBlockBytes(options.identity.layout))
    return InvalidArgument("disk KV tier: " + std::to_string(options.capacity_bytes) +
                           " bytes hold no block of " +
                           std::to_string(EncodedBlockBytes(options.identity.layout)) + " bytes");
  std::error_code ec;
  if (!fs::exists(options.dir, ec)) {
    fs::create_directories(options.dir, ec);
    if (ec) return InvalidArgument("disk KV tier: cannot create '" + options.dir + "': " + ec.message());
    ::chmod(options.dir.c_str(), 0700);
  }
  if (!fs::is_directory(options.dir, ec))
    return InvalidArgument("disk KV tier: '" + options.dir + "' is not a directory");
  std::unique_ptr<DiskTier> t(new DiskTier(options));
  if (options.erase_at_open) t->EraseAll();
  KV_RETURN_IF_ERROR(t->Rebuild());
  return t;
}

std::string DiskTier::PathOf(const BlockKey& key) const {
  return options_.dir + "/" + KeyHex(key) + std::string(kSuffix);
}

Status DiskTier::Rebuild() {
  struct Found {
    BlockKey key;
    uint64_t bytes;
    FileClock::time_point written;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = de.path().filename().string();
    if (name.rfind(kTempPrefix, 0) == 0) {  // a write a crash cut short
      fs::remove(de.path(), ec);
      continue;
    }
    BlockKey key;
    if (name.size() != 64 + kSuffix.size() || name.substr(64) != kSuffix ||
        !ParseKeyHex(std::string_view(name).substr(0, 64), &key))
      continue;
    const std::string path = de.path().string();
    auto head = ReadFile(path, kBlockHeaderBytes, options_.direct_reads);
    if (!head.ok()) continue;
    DecodedBlock peek = PeekBlockHeader(*head);
    if (peek.ok() && (peek.header.root != options_.identity.root ||
                      !(peek.header.layout == options_.identity.layout))) {
      ++report_.foreign_entries;  // another model's: never read further
      continue;
    }
    auto bytes = ReadFile(path, 0, options_.direct_reads);
    DecodedBlock d = bytes.ok() ? DecodeBlock(*bytes, options_.identity, &key, options_.secret)
                                : DecodedBlock{BlockError::kTruncated, "unreadable", {}, {}};
    if (!d.ok()) {
      KV_LOG_WARN << "disk KV tier: dropping " << path << ": " << d.status().message();
      ::unlink(path.c_str());
      ++report_.dropped;
      continue;
    }
    struct stat st {};
    FileClock::time_point written = FileClock::now();
    if (::stat(path.c_str(), &st) == 0) written = FileClock::from_time_t(st.st_mtime);
    found.push_back({key, bytes->size(), written});
  }
  if (ec) return InvalidArgument("disk KV tier: cannot list '" + options_.dir + "': " + ec.message());
  // The most recently written first in the LRU.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.written > b.written; });
  std::lock_guard<std::mutex> lock(mu_);
  for (const Found& f : found) index_.Restore(f.key, f.bytes, 0, f.written);
  report_.loaded = found.size();
  // Over a smaller capacity than before: the oldest go.
  stats_.evicted_blocks += index_.EvictDownTo(
      options_.capacity_bytes,
      [&](const BlockKey& key, const TierIndex::Entry&) { ::unlink(PathOf(key).c_str()); });
  KV_LOG_INFO << "disk KV tier " << options_.dir << ": " << report_.loaded << " entries ("
              << index_.used() << " bytes), " << report_.foreign_entries
              << " of another model or layout left unread, " << report_.dropped
              << " that did not verify deleted";
  return OkStatus();
}

void DiskTier::EraseLocked(const BlockKey& key) {
  if (index_.Remove(key)) ::unlink(PathOf(key).c_str());
}

void DiskTier::FailRead(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(key);
  ++stats_.read_failures;
}

bool DiskTier::Contains(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.Contains(key);
}

bool DiskTier::Pin(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.Ref(key);
}

void DiskTier::Unpin(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  index_.Unref(key);
}

Status DiskTier::Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TierIndex::Entry* e = index_.Find(key);
    if (e != nullptr && index_.Expired(*e) && e->refs == 0) {
      EraseLocked(key);
      ++stats_.evicted_blocks;
      e = nullptr;
    }
    if (e == nullptr) {
      ++stats_.miss_blocks;
      return NotFound("disk KV tier: block " + KeyHex(key).substr(0, 16) + " not held");
    }
    index_.Ref(key);  // not evicted while the file is read
  }
  const std::string path = PathOf(key);
  auto bytes = ReadFile(path, 0, options_.direct_reads);
  if (!bytes.ok()) {
    FailRead(key);
    return DataLoss("disk KV tier: " + bytes.status().message());
  }
  const DecodedBlock d = DecodeBlock(*bytes, options_.identity, &key, options_.secret);
  if (!d.ok()) {
    KV_LOG_WARN << "disk KV tier: " << path << " refused: " << d.status().message();
    FailRead(key);
    return d.status();
  }
  const size_t block_bytes = options_.identity.layout.block_bytes();
  Status copied = layers.size() == size_t(options_.identity.layout.num_layers)
                      ? OkStatus()
                      : InvalidArgument("disk KV tier: wrong number of layers asked for");
  for (size_t l = 0; l < layers.size() && copied.ok(); ++l) {
    if (layers[l].size() != block_bytes) {
      copied = InvalidArgument("disk KV tier: a layer buffer of the wrong size");
      break;
    }
    std::memcpy(layers[l].data(), d.payload.data() + l * block_bytes, block_bytes);
  }
  std::lock_guard<std::mutex> lock(mu_);
  index_.Unref(key);
  if (!copied.ok()) return copied;
  index_.Touch(key);
  ++stats_.hit_blocks;
  stats_.bytes_read += bytes->size();
  return OkStatus();
}

Status DiskTier::Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) {
  if (header.root != options_.identity.root || !(header.layout == options_.identity.layout))
    return InvalidArgument("disk KV tier: a block of another identity");
  const uint64_t size = EncodedBlockBytes(header.layout);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.Find(header.key) != nullptr) {
      index_.Touch(header.key);
      return OkStatus();
    }
    // Reserved while the file is written.
    if (!index_.Reserve(size, [&](const BlockKey& key, const TierIndex::Entry&) {
          ::unlink(PathOf(key).c_str());
          ++stats_.evicted_blocks;
        })) {
      ++stats_.write_failures;
      return ResourceExhausted("disk KV tier: no room");
    }
    seq = ++temp_seq_;
  }
  auto fail = [&](Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    index_.Unreserve(size);
    ++stats_.write_failures;
    return s;
  };
  const std::span<std::byte> enc(ThreadBuffer(size), size);
  if (Status s = EncodeBlockTo(header, layers, options_.secret, enc); !s.ok()) return fail(s);
  const std::string final_path = PathOf(header.key);
  const std::string temp = options_.dir + "/" + std::string(kTempPrefix) + KeyHex(header.key) +
                           "-" + std::to_string(::getpid()) + "-" + std::to_string(seq);
  // O_DIRECT (Options::direct_writes): the entry's whole 4 KiB pages straight from the aligned
  // buffer, then the tail through the page cache; buffered where the file system refuses it.
  bool direct = options_.direct_writes && size >= kDirectAlign;
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  int fd = direct ? ::open(temp.c_str(), flags | O_DIRECT, 0600) : -1;
  if (fd < 0 && direct) {
    ::unlink(temp.c_str());  // some file systems create it before refusing O_DIRECT
    direct = false;
  }
  if (fd < 0) fd = ::open(temp.c_str(), flags, 0600);
  if (fd < 0) return fail(Unavailable(Errno("disk KV tier: create " + temp)));
  const size_t aligned = size / kDirectAlign * kDirectAlign;
  auto buffered = [&] {
    direct = false;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
  };
  size_t done = 0;
  while (done < enc.size()) {
    if (direct && done >= aligned) buffered();  // the tail
    const size_t want = direct ? aligned - done : enc.size() - done;
    const ssize_t n = ::write(fd, enc.data() + done, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && direct) {  // refused: the rest buffered
      buffered();
      continue;
    }
    if (n <= 0) break;
    done += size_t(n);
    if (direct && done % kDirectAlign != 0) buffered();  // short mid-page: the rest buffered
  }
  const int write_errno = errno;
  const bool closed = ::close(fd) == 0;
  if (done != enc.size() || !closed) {
    ::unlink(temp.c_str());
    errno = done != enc.size() ? write_errno : errno;
    return fail(ResourceExhausted(Errno("disk KV tier: write " + temp)));
  }
  // Visible under its name only now, complete (no fsync: a crash may lose it, and a block
  // that then fails to verify is deleted, never used).
  if (::rename(temp.c_str(), final_path.c_str()) != 0) {
    ::unlink(temp.c_str());
    return fail(Unavailable(Errno("disk KV tier: rename " + temp)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Written by two writers at once: one entry (the other's reservation returned), counted once.
  if (index_.Insert(header.key, size, 0, FileClock::now())) {
    ++stats_.written_blocks;
    stats_.bytes_written += size;
  }
  return OkStatus();
}

void DiskTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(key);
}

void DiskTier::EraseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  index_.Clear([&](const BlockKey& key, const TierIndex::Entry&) { ::unlink(PathOf(key).c_str()); });
  // Every entry file, of any identity, and every temporary file.
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = de.path().filename().string();
    const bool entry = name.size() == 64 + kSuffix.size() && name.substr(64) == kSuffix;
    if (entry || name.rfind(kTempPrefix, 0) == 0) fs::remove(de.path(), ec);
  }
  report_.foreign_entries = 0;
}

TierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  s.entries = index_.entries();
  s.bytes_used = index_.used();
  return s;
}

}  // namespace kvstream::kvcache
