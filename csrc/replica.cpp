#include "replica.hpp"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "codec.hpp"

namespace crest {

namespace {

constexpr char kMagic[8] = {'C', 'R', 'E', 'S', 'T', 'R', 'P', 'L'};
// Header fields, little-endian, at these offsets of the first kReplicaHeaderBytes bytes (docs/replica-format.md).
constexpr std::size_t kVersionAt = 8, kHeaderCrcAt = 12, kFileSizeAt = 16, kEntriesAt = 24, kUnreadableAt = 32,
                      kSlotsAt = 40, kRecordsAt = 48, kRecordsBytesAt = 56, kSlotTableAt = 64, kKeyWidthAt = 72,
                      kNsMaskAt = 76, kBlockSlotsAt = 80, kIdentityLenAt = 84, kIdentityAt = 88;
constexpr std::size_t kCheckBytes = 8;  // a block's or a record's check: hash_bytes, little-endian
// A record's fixed part before its payload: key length, key (at most 31 ids of 4 bytes), payload length (varint).
constexpr std::size_t kRecordHeadMax = 1 + kMaxKeyTokens * 4 + 10;
constexpr uint64_t kOffsetMask = (1ULL << 48) - 1;
constexpr double kLoad = 0.75;  // the slot table's load factor

uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= static_cast<uint64_t>(p[b]) << (8 * b);
  return v;
}

// A slot: 8 bytes, little-endian (one load on a little-endian host).
inline uint64_t load_slot(const uint8_t* p) {
  if constexpr (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else {
    return load_le(p, 8);
  }
}

void store_le(uint8_t* p, uint64_t v, int bytes) {
  for (int b = 0; b < bytes; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
}

uint32_t crc_of(const uint8_t* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {  // zlib takes at most 4 GiB a call
    uInt chunk = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

uint32_t header_crc(const uint8_t* header) {
  uint8_t copy[kReplicaHeaderBytes];
  std::memcpy(copy, header, kReplicaHeaderBytes);
  std::memset(copy + kHeaderCrcAt, 0, 4);
  return crc_of(copy, kReplicaHeaderBytes);
}

uint64_t slot_index(uint64_t hash, uint64_t slots) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * slots) >> 64);
}

std::string os_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

constexpr std::size_t kBlockCheckAt = kBlockSlots * 8;  // a block: its slots, then their check
static_assert(kBlockCheckAt + kCheckBytes == kBlockBytes, "a slot block is one cache line");

// -- reads a truncated file cannot crash ------------------------------------------------------------------------------
// A mapped file cut short under its mapping raises SIGBUS on the next read past its new end. A thread reading the
// mapping arms its guard (sigsetjmp); the handler jumps back to it, and the read reports failure. Any other SIGBUS goes
// to the handler that was there before (Python's faulthandler, or the default action).

struct FaultGuard {
  sigjmp_buf at;
  volatile sig_atomic_t armed = 0;
};

FaultGuard& fault_guard() {
  thread_local FaultGuard guard;
  return guard;
}

struct sigaction previous_bus_action;

void on_bus_error(int sig, siginfo_t* info, void* context) {
  FaultGuard& guard = fault_guard();
  if (guard.armed) {
    guard.armed = 0;
    siglongjmp(guard.at, 1);
  }
  const struct sigaction& before = previous_bus_action;
  if (before.sa_flags & SA_SIGINFO) {
    before.sa_sigaction(sig, info, context);
  } else if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
    before.sa_handler(sig);
  } else {  // the default action: restored, and the faulting read runs again and ends the process as it would have
    ::signal(SIGBUS, SIG_DFL);
  }
}

void install_bus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_bus_error;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;  // not blocked in the handler: the jump back leaves the mask as it was
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &previous_bus_action);
  });
}

}  // namespace

bool read_mapped(const uint8_t* from, std::size_t size, void* to) {
  FaultGuard& guard = fault_guard();
  if (sigsetjmp(guard.at, 0) != 0) return false;  // the handler jumped back: the file no longer holds these bytes
  guard.armed = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(to, from, size);  // nothing allocated or locked while armed: safe to abandon
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guard.armed = 0;
  return true;
}

uint64_t hash_bytes(const uint8_t* data, std::size_t len, uint64_t seed) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (static_cast<uint64_t>(len) * 0xC2B2AE3D27D4EB4FULL) ^ seed;
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    h ^= load_slot(data + i);  // 8 bytes, little-endian
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 31;
  }
  if (i < len) {  // the last chunk, zero-padded
    h ^= load_le(data + i, static_cast<int>(len - i));
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 31;
  }
  h ^= h >> 33;  // MurmurHash3's finalizer
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

bool encode_key(const uint32_t* tokens, int n, int width, uint8_t* out) {
  for (int i = 0; i < n; ++i) {
    uint32_t t = tokens[i];
    if (width < 4 && (t >> (8 * width)) != 0) return false;
    for (int b = 0; b < width; ++b) out[i * width + b] = static_cast<uint8_t>(t >> (8 * (width - 1 - b)));
  }
  return true;
}

// -- the reader ----------------------------------------------------------------------------------------------------

Replica::Replica(const std::string& path) : path_(path) {
  install_bus_handler();
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw ReplicaError(os_error("cannot open", path));
  try {
    // A shared lock while mapped: whoever removes old replicas takes an exclusive one, and skips a file held.
    if (::flock(fd_, LOCK_SH | LOCK_NB) != 0) throw ReplicaError(os_error("cannot lock", path));
    if (::fstat(fd_, &opened_) != 0) throw ReplicaError(os_error("cannot stat", path));
    size_ = static_cast<std::size_t>(opened_.st_size);
    if (size_ < kReplicaHeaderBytes)
      throw ReplicaError(path + " is " + std::to_string(size_) + " bytes, shorter than a replica's header");
    // A file that fits in half of the RAM is mapped with its page tables filled at once (MAP_POPULATE): a lookup then
    // costs cache misses, not a page fault per first-touched page (a few microseconds each, on every new key). A larger
    // one is faulted in as lookups touch it, without readahead (a lookup touches a slot block and a record).
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    const bool fits = pages > 0 && page > 0 && size_ <= static_cast<std::size_t>(pages) * page / 2;
    void* map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED | (fits ? MAP_POPULATE : 0), fd_, 0);
    if (map == MAP_FAILED) throw ReplicaError(os_error("cannot map", path));
    base_ = static_cast<const uint8_t*>(map);
    if (!fits) ::madvise(map, size_, MADV_RANDOM);
    uint8_t h[kReplicaHeaderBytes];  // read once, from a copy: the file may be cut short meanwhile
    if (!read_mapped(base_, kReplicaHeaderBytes, h)) throw ReplicaError(path + " was cut short while it was opened");
    if (std::memcmp(h, kMagic, sizeof kMagic) != 0) throw ReplicaError(path + " is not a crest-spec replica");
    if (load_le(h + kVersionAt, 4) != kReplicaVersion)
      throw ReplicaError(path + " is replica format version " + std::to_string(load_le(h + kVersionAt, 4)) +
                         "; this build reads version " + std::to_string(kReplicaVersion));
    if (load_le(h + kHeaderCrcAt, 4) != header_crc(h)) throw ReplicaError(path + ": the header fails its CRC");
    uint64_t want = load_le(h + kFileSizeAt, 8);
    if (want != size_)
      throw ReplicaError(path + " is " + std::to_string(size_) + " bytes; its header says " + std::to_string(want) +
                         " (truncated or extended)");
    entries_ = load_le(h + kEntriesAt, 8);
    unreadable_ = load_le(h + kUnreadableAt, 8);
    slots_ = load_le(h + kSlotsAt, 8);
    uint64_t records_at = load_le(h + kRecordsAt, 8), slots_at = load_le(h + kSlotTableAt, 8);
    records_bytes_ = load_le(h + kRecordsBytesAt, 8);
    key_width_ = static_cast<int>(load_le(h + kKeyWidthAt, 4));
    uint64_t identity_len = load_le(h + kIdentityLenAt, 4);
    if ((key_width_ != 2 && key_width_ != 4) || slots_ < entries_ || slots_ % kBlockSlots != 0 ||
        slots_ / kBlockSlots > size_ / kBlockBytes || load_le(h + kBlockSlotsAt, 4) != kBlockSlots ||
        identity_len > kReplicaHeaderBytes - kIdentityAt || records_at < kReplicaHeaderBytes ||
        records_at + records_bytes_ > size_ || slots_at % kBlockBytes != 0 ||
        slots_at + slots_ / kBlockSlots * kBlockBytes > size_ || records_bytes_ > kOffsetMask)
      throw ReplicaError(path + ": the header's sizes and offsets do not fit the file");
    slot_table_ = base_ + slots_at;
    records_ = base_ + records_at;
    if (!blocks_intact()) throw ReplicaError(path + ": the slot table fails its check");
    uint32_t mask = static_cast<uint32_t>(load_le(h + kNsMaskAt, 4));
    for (int n = kMaxKeyTokens; n >= 1; --n)
      if (mask >> n & 1) lengths_.push_back(n);
    identity_.assign(reinterpret_cast<const char*>(h + kIdentityAt), identity_len);
  } catch (...) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    ::close(fd_);
    throw;
  }
}

Replica::~Replica() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

bool Replica::unchanged() const {
  struct stat now {};
  if (::fstat(fd_, &now) != 0) return false;
  // Not the change time: unlinking or renaming over the file changes it, and a removed or replaced file still maps
  // its build intact (datastore.replica readies the path again; only a write to the mapped inode is damage).
  return now.st_size == opened_.st_size && now.st_mtim.tv_sec == opened_.st_mtim.tv_sec &&
         now.st_mtim.tv_nsec == opened_.st_mtim.tv_nsec;
}

bool Replica::blocks_intact() const {
  uint8_t block[kBlockBytes];
  for (uint64_t b = 0; b < slots_ / kBlockSlots; ++b)
    if (!load_block(b, block)) return false;
  return true;
}

bool Replica::load_block(uint64_t b, uint8_t* out) const {
  if (!read_mapped(slot_table_ + b * kBlockBytes, kBlockBytes, out)) return false;
  return hash_bytes(out, kBlockCheckAt, b) == load_slot(out + kBlockCheckAt);
}

Replica::Record Replica::read_record(uint64_t at, const uint8_t* key, std::size_t len, Tree& out,
                                     std::vector<uint8_t>& record) const {
  if (at >= records_bytes_) return Record::kDamaged;
  const std::size_t avail = static_cast<std::size_t>(records_bytes_ - at);
  uint8_t head[kRecordHeadMax];  // the key's length, the key and the payload's length (a varint of at most 10 bytes)
  std::size_t got = std::min(avail, 1 + len + 10);  // no more than a record of this key reads: a line missed costs
  if (!read_mapped(records_ + at, got, head)) return Record::kDamaged;
  if (head[0] != len) {  // another key (checked below as every record is, before it counts as another key's)
    if (head[0] == 0 || head[0] > kMaxKeyTokens * 4) return Record::kDamaged;  // no key is that long
    got = std::min(avail, 1 + static_cast<std::size_t>(head[0]) + 10);
    if (!read_mapped(records_ + at, got, head)) return Record::kDamaged;
  }
  std::size_t pos = 1 + head[0];
  uint64_t payload_len;
  try {
    if (pos > got) return Record::kDamaged;
    payload_len = read_varint(head, got, pos);
  } catch (const std::invalid_argument&) {
    return Record::kDamaged;
  }
  if (payload_len > avail || pos + payload_len + kCheckBytes > avail) return Record::kDamaged;
  const std::size_t size = pos + static_cast<std::size_t>(payload_len);
  record.resize(size + kCheckBytes);
  if (!read_mapped(records_ + at, record.size(), record.data())) return Record::kDamaged;
  const uint8_t* r = record.data();
  if (hash_bytes(r, size, at) != load_slot(r + size)) return Record::kDamaged;
  if (r[0] != len || std::memcmp(r + 1, key, len) != 0) return Record::kOtherKey;  // a tag shared by another key
  if (payload_len == 0) return Record::kUnreadable;
  try {
    parse_payload(r + pos + 1, size - pos - 1, r[pos], out);
  } catch (const std::invalid_argument&) {
    return Record::kDamaged;
  }
  return Record::kFound;
}

Probe Replica::find(const uint32_t* tokens, int n, Tree& out, std::vector<uint8_t>& record) const {
  if (n < 1 || n > kMaxKeyTokens || slots_ == 0) return Probe::kAbsent;
  uint8_t key[kMaxKeyTokens * 4];
  if (!encode_key(tokens, n, key_width_, key)) return Probe::kAbsent;  // an id wider than the build's keys
  const std::size_t len = static_cast<std::size_t>(n) * key_width_;
  const uint64_t hash = key_hash(key, len), tag = hash & 0xFFFF;
  alignas(kBlockBytes) uint8_t block[kBlockBytes];
  uint64_t loaded = UINT64_MAX;  // the slot block in `block`
  uint64_t i = slot_index(hash, slots_);
  for (uint64_t probed = 0; probed < slots_; ++probed, i = i + 1 == slots_ ? 0 : i + 1) {
    const uint64_t b = i / kBlockSlots;
    if (b != loaded) {
      if (!load_block(b, block)) return Probe::kDamaged;
      loaded = b;
    }
    uint64_t slot = load_slot(block + (i - b * kBlockSlots) * 8);
    if (slot == 0) return Probe::kAbsent;
    if (slot >> 48 != tag) continue;
    switch (read_record((slot & kOffsetMask) - 1, key, len, out, record)) {
      case Record::kOtherKey:
        continue;
      case Record::kFound:
        return Probe::kFound;
      case Record::kUnreadable:
        return Probe::kUnreadable;
      case Record::kDamaged:
        return Probe::kDamaged;
    }
  }
  return Probe::kAbsent;
}

void Replica::prefetch(const uint32_t* tokens, std::size_t n) const {
  if (slots_ == 0) return;
  uint8_t key[kMaxKeyTokens * 4];
  for (int len : lengths_) {
    if (static_cast<std::size_t>(len) > n) continue;
    if (!encode_key(tokens + n - len, len, key_width_, key)) continue;
    const uint64_t b = slot_index(key_hash(key, static_cast<std::size_t>(len) * key_width_), slots_) / kBlockSlots;
    __builtin_prefetch(slot_table_ + b * kBlockBytes);
  }
}

bool stored_suffixes(const Replica& replica, const uint32_t* tokens, std::size_t n, bool every, std::vector<Tree>& trees,
                     std::vector<int>& lengths, std::size_t& found, std::vector<uint8_t>& record) {
  found = 0;
  lengths.clear();
  for (int len : replica.lengths()) {  // longest first
    if (static_cast<std::size_t>(len) > n) continue;
    if (trees.size() <= found) trees.resize(found + 1);
    switch (replica.find(tokens + n - len, len, trees[found], record)) {
      case Probe::kDamaged:
        return false;
      case Probe::kUnreadable:
        if (!every) return true;
        continue;
      case Probe::kAbsent:
        continue;
      case Probe::kFound:
        lengths.push_back(len);
        ++found;
        if (!every) return true;
    }
  }
  return true;
}

// -- the writer ----------------------------------------------------------------------------------------------------

ReplicaWriter::ReplicaWriter(const std::string& path, int key_width, std::string identity)
    : path_(path), key_width_(key_width), identity_(std::move(identity)) {
  if (key_width != 2 && key_width != 4) throw ReplicaError("key width " + std::to_string(key_width) + " is not 2 or 4");
  if (identity_.size() > kReplicaHeaderBytes - kIdentityAt)
    throw ReplicaError("a replica's identity is at most " + std::to_string(kReplicaHeaderBytes - kIdentityAt) +
                       " bytes");
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw ReplicaError(os_error("cannot create", path));
  buffer_.reserve(1 << 20);
}

ReplicaWriter::~ReplicaWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ReplicaWriter::write_at(const uint8_t* data, std::size_t size, uint64_t offset) {
  while (size > 0) {
    ssize_t wrote = ::pwrite(fd_, data, size, static_cast<off_t>(offset));
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw ReplicaError(os_error("cannot write", path_));
    }
    data += wrote;
    size -= static_cast<std::size_t>(wrote);
    offset += static_cast<uint64_t>(wrote);
  }
}

void ReplicaWriter::flush() {
  write_at(buffer_.data(), buffer_.size(), kReplicaHeaderBytes + records_bytes_ - buffer_.size());
  buffer_.clear();
}

void ReplicaWriter::add_record(const uint8_t* key, std::size_t key_len, int width, const uint8_t* payload,
                               std::size_t size) {
  const std::size_t n = key_len / key_width_;
  if (key_len == 0 || key_len % key_width_ != 0 || n > kMaxKeyTokens)
    throw ReplicaError("a key of " + std::to_string(key_len) + " bytes is not 1.." + std::to_string(kMaxKeyTokens) +
                       " token ids of " + std::to_string(key_width_) + " bytes");
  if (records_bytes_ > kOffsetMask - (1 << 26)) throw ReplicaError("the replica's records exceed 2**48 bytes");
  ns_mask_ |= 1u << n;
  entries_.emplace_back(key_hash(key, key_len), records_bytes_);
  const std::size_t before = buffer_.size();
  buffer_.push_back(static_cast<uint8_t>(key_len));
  buffer_.insert(buffer_.end(), key, key + key_len);
  if (payload == nullptr) {
    append_varint(0, buffer_);  // the build's tree is unreadable: stored as such
    ++unreadable_;
  } else {
    append_varint(size + 1, buffer_);
    buffer_.push_back(static_cast<uint8_t>(width));
    buffer_.insert(buffer_.end(), payload, payload + size);
  }
  uint8_t check[kCheckBytes];
  store_le(check, hash_bytes(buffer_.data() + before, buffer_.size() - before, records_bytes_), kCheckBytes);
  buffer_.insert(buffer_.end(), check, check + kCheckBytes);
  records_bytes_ += buffer_.size() - before;
  if (buffer_.size() >= (1 << 20)) flush();
}

namespace {

uint32_t be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 | static_cast<uint32_t>(p[2]) << 8 | p[3];
}

}  // namespace

ReplicaWriter::ZstdFrames ReplicaWriter::zstd_frames(const std::vector<Pending>& pending) {
  static constexpr uint8_t kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
  ZstdFrames out;
  for (const auto& p : pending) {
    if (!p.zstd()) continue;
    out.segments.push_back(out.frames.size());
    out.segments.push_back(p.body_len + sizeof kZstdMagic);
    out.sizes.push_back(p.raw_len);
    out.frames.insert(out.frames.end(), kZstdMagic, kZstdMagic + sizeof kZstdMagic);
    out.frames.insert(out.frames.end(), p.body, p.body + p.body_len);
  }
  return out;
}

std::size_t ReplicaWriter::add_copy(const uint8_t* data, std::size_t size, std::vector<Pending>& pending) {
  static constexpr uint8_t kSignature[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xFF, '\r', '\n', 0};
  std::size_t pos = 0;
  if (!copy_started_) {
    if (size < 19) return 0;
    if (std::memcmp(data, kSignature, sizeof kSignature) != 0)
      throw ReplicaError("the rows are not a binary COPY stream");
    std::size_t extension = be32(data + 15);
    if (size < 19 + extension) return 0;
    pos = 19 + extension;
    copy_started_ = true;
  }
  while (pos + 2 <= size && !copy_ended_) {
    int16_t fields = static_cast<int16_t>(data[pos] << 8 | data[pos + 1]);
    if (fields == -1) {
      copy_ended_ = true;
      pos += 2;
      break;
    }
    if (fields != 2) throw ReplicaError("a COPY row has " + std::to_string(fields) + " columns; expected key, tree");
    std::size_t p = pos + 2;
    if (p + 4 > size) break;
    int32_t key_len = static_cast<int32_t>(be32(data + p));
    if (key_len < 0) throw ReplicaError("a COPY row's key is NULL");
    if (p + 4 + key_len + 4 > size) break;
    const uint8_t* key = data + p + 4;
    p += 4 + key_len;
    int32_t blob_len = static_cast<int32_t>(be32(data + p));
    if (blob_len < 0) throw ReplicaError("a COPY row's tree is NULL");
    if (p + 4 + blob_len > size) break;
    const uint8_t* blob = data + p + 4;
    p += 4 + blob_len;
    pos = p;
    BlobHeader h;
    try {
      h = parse_blob_header(blob, static_cast<std::size_t>(blob_len));
    } catch (const std::invalid_argument&) {
      add_record(key, key_len, 0, nullptr, 0);  // the build's tree is unreadable: stored as such
      continue;
    }
    if (h.compression == kCompressionNone) {
      bool readable = true;
      try {
        parse_checked(blob, h, blob + h.body, blob_len - h.body, scratch_);
      } catch (const std::invalid_argument&) {
        readable = false;
      }
      add_record(key, key_len, h.width, readable ? blob + h.body : nullptr, blob_len - h.body);
      continue;
    }
    Pending row{key, static_cast<std::size_t>(key_len), blob + h.body, blob_len - h.body, {blob[0], blob[1], blob[2]},
                h.crc, h.raw_len};
    pending.push_back(row);
  }
  return pos;
}

void ReplicaWriter::complete(const Pending& row, const uint8_t* payload, std::size_t size) {
  BlobHeader h;
  h.width = row.header3[2] & 0x0F;
  h.crc = row.crc;
  h.raw_len = row.raw_len;
  if (payload != nullptr) {
    try {
      parse_checked(row.header3, h, payload, size, scratch_);
    } catch (const std::invalid_argument&) {
      payload = nullptr;
    }
  }
  add_record(row.key, row.key_len, h.width, payload, size);
}

void ReplicaWriter::finish() {
  if (copy_started_ && !copy_ended_) throw ReplicaError("the COPY stream ended before its trailer");
  flush();
  const uint64_t count = entries_.size();
  uint64_t slots = std::max<uint64_t>(16, static_cast<uint64_t>(static_cast<double>(count) / kLoad) + 1);
  slots = (slots + kBlockSlots - 1) / kBlockSlots * kBlockSlots;  // whole blocks
  const uint64_t blocks = slots / kBlockSlots;
  std::vector<uint8_t> table(blocks * kBlockBytes, 0);
  auto at_slot = [&](uint64_t i) { return table.data() + i / kBlockSlots * kBlockBytes + i % kBlockSlots * 8; };
  for (const auto& [hash, at] : entries_) {
    uint64_t i = slot_index(hash, slots);
    while (load_le(at_slot(i), 8) != 0) i = i + 1 == slots ? 0 : i + 1;
    store_le(at_slot(i), (hash & 0xFFFF) << 48 | (at + 1), 8);
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    uint8_t* block = table.data() + b * kBlockBytes;
    store_le(block + kBlockCheckAt, hash_bytes(block, kBlockCheckAt, b), kCheckBytes);
  }
  const uint64_t slots_at = (kReplicaHeaderBytes + records_bytes_ + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
  write_at(table.data(), table.size(), slots_at);
  uint8_t header[kReplicaHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  store_le(header + kVersionAt, kReplicaVersion, 4);
  store_le(header + kFileSizeAt, slots_at + table.size(), 8);
  store_le(header + kEntriesAt, count, 8);
  store_le(header + kUnreadableAt, unreadable_, 8);
  store_le(header + kSlotsAt, slots, 8);
  store_le(header + kRecordsAt, kReplicaHeaderBytes, 8);
  store_le(header + kRecordsBytesAt, records_bytes_, 8);
  store_le(header + kSlotTableAt, slots_at, 8);
  store_le(header + kKeyWidthAt, static_cast<uint64_t>(key_width_), 4);
  store_le(header + kNsMaskAt, ns_mask_, 4);
  store_le(header + kBlockSlotsAt, kBlockSlots, 4);
  store_le(header + kIdentityLenAt, identity_.size(), 4);
  std::memcpy(header + kIdentityAt, identity_.data(), identity_.size());
  store_le(header + kHeaderCrcAt, header_crc(header), 4);
  write_at(header, sizeof header, 0);
  if (::fsync(fd_) != 0) throw ReplicaError(os_error("cannot sync", path_));
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw ReplicaError(os_error("cannot close", path_));
  }
  fd_ = -1;
}

}  // namespace crest
