// A host-local replica of one datastore build (docs/replica-format.md): one read-only file per build that every
// drafting process on the host maps, so the page cache holds a single copy and a lookup is a few memory reads. It is
// a static hash table (open addressing, linear probing) of the build's n-gram keys over records that hold each key and
// its tree's payload (codec.hpp), written once from the build's rows (ReplicaWriter) and never changed in place. The
// header ties it to its build (an identity the client checks against the registry) and carries its own CRC-32.
//
// Every byte that decides a lookup is checked before it is used: each block of slots (a cache line) holds their hash,
// each record (its key, length and payload) has one of its own (hash_bytes: no table, a few cycles per 8 bytes), and a lookup copies what it reads out of the
// mapping first (checked, then parsed from the copy). A read that the file no longer backs (it was truncated while
// mapped: SIGBUS) is caught and fails the lookup, as a failed check does: the lookup reports the file damaged
// (Probe::kDamaged) and the caller drafts from the round trip. A file that is missing, of another build, truncated or
// corrupt is refused when it is opened (ReplicaError).
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "codec.hpp"
#include "tree.hpp"

namespace crest {

constexpr uint32_t kReplicaVersion = 2;
constexpr std::size_t kReplicaHeaderBytes = 4096;
// The slot table is read a block at a time: a cache line of kBlockSlots slots and their check (replica-format.md).
constexpr uint64_t kBlockSlots = 7;
constexpr std::size_t kBlockBytes = 64;
constexpr int kMaxKeyTokens = 31;  // n-gram lengths are bits of a 32-bit mask

class ReplicaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The format's 64-bit hash of `len` bytes from `seed`: of a key (seed 0: the slot it starts probing at, and a 16-bit tag
// kept in the slot), and the check of a slot block (seed: its number) and of a record (seed: its offset). A change to
// any one 8-byte chunk always changes it; any other change, but with probability 2^-64.
uint64_t hash_bytes(const uint8_t* data, std::size_t len, uint64_t seed);
inline uint64_t key_hash(const uint8_t* key, std::size_t len) { return hash_bytes(key, len, 0); }

// A key: the n token ids, each `width` bytes big-endian (datastore/keys.py). False when an id does not fit the width.
bool encode_key(const uint32_t* tokens, int n, int width, uint8_t* out);

enum class Probe : int {
  kAbsent = 0,      // the build holds no tree for the key
  kFound = 1,       // the tree, decoded
  kUnreadable = 2,  // the build's own tree for the key failed to decode (the round trip serves it as absent)
  kDamaged = 3,     // the file is damaged: a check failed, a record lies outside the file, or the file was cut short
};

// Copy `size` mapped bytes at `from` to `to`; false when the file no longer backs them (it was truncated while mapped:
// the read's SIGBUS is caught, for this thread only, while it copies). Async-signal-safe to abandon: nothing is
// allocated or locked while it reads. The first Replica installs the SIGBUS handler (any earlier handler is called
// for every other SIGBUS).
bool read_mapped(const uint8_t* from, std::size_t size, void* to);

class Replica {
 public:
  // Map the replica at `path` and check its header, size and slot table. Throws ReplicaError naming what is wrong.
  explicit Replica(const std::string& path);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // The tree of the n-gram tokens[0..n) into `out`, its record copied into `record` (scratch) first. Reentrant: any
  // number of threads may probe at once.
  Probe find(const uint32_t* tokens, int n, Tree& out, std::vector<uint8_t>& record) const;
  // Ask the CPU to fetch the slot block where each stored suffix of tokens[0..n) starts probing (a hint: nothing is
  // read, checked or faulted in). A drafting step runs on caches a forward pass has just flushed, and find's probes
  // for a request's suffixes, longest first, each wait for their own block: fetched together first, their misses
  // overlap.
  void prefetch(const uint32_t* tokens, std::size_t n) const;
  // Whether the mapped file is as it was mapped (fstat: size and modification time); a file written in place is
  // damaged (a replica is never rewritten, only replaced). Asked by the replicas' keeper (datastore.replica, once a
  // second), not by a drafting step: a step's reads are checked byte for byte, and a syscall per replica per step cost
  // the hook 8-10 us on caches a forward pass has just flushed.
  bool unchanged() const;

  const std::string& identity() const { return identity_; }
  const std::vector<int>& lengths() const { return lengths_; }  // the stored n-gram lengths, longest first
  int key_width() const { return key_width_; }
  uint64_t entries() const { return entries_; }
  uint64_t unreadable() const { return unreadable_; }
  uint64_t slots() const { return slots_; }
  std::size_t file_size() const { return size_; }
  const std::string& path() const { return path_; }
  uint64_t inode() const { return static_cast<uint64_t>(opened_.st_ino); }

 private:
  enum class Record { kOtherKey, kFound, kUnreadable, kDamaged };
  // Slot block `b` copied into `out` and checked; false when it fails its check or cannot be read.
  bool load_block(uint64_t b, uint8_t* out) const;
  // The record at offset `at` of the records, copied into `record` and checked; its tree parsed when its key is `key`.
  Record read_record(uint64_t at, const uint8_t* key, std::size_t len, Tree& out, std::vector<uint8_t>& record) const;
  bool blocks_intact() const;  // every slot block against its check (when opened)

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  struct stat opened_ {};
  const uint8_t* slot_table_ = nullptr;
  const uint8_t* records_ = nullptr;
  uint64_t slots_ = 0, entries_ = 0, unreadable_ = 0, records_bytes_ = 0;
  int key_width_ = 0;
  std::vector<int> lengths_;
  std::string identity_;
};

// The stored suffixes of tokens[0..n), longest first, into trees[0..k) and their lengths (k returned in `found`): the
// longest only, unless `every`. A tree the build could not decode counts as absent: the longest lookup stops there (as
// the round trip's does), `every` skips it. False when the replica is damaged. `trees` grows as needed; `record` is
// scratch.
bool stored_suffixes(const Replica& replica, const uint32_t* tokens, std::size_t n, bool every, std::vector<Tree>& trees,
                     std::vector<int>& lengths, std::size_t& found, std::vector<uint8_t>& record);

// Writes a replica to a new file: rows are added (a binary COPY stream of (key bytea, tree bytea), or keys with their
// payloads), then `finish` writes the slot table and the header and syncs the file. The caller renames it into place.
class ReplicaWriter {
 public:
  // A row whose blob is compressed: the caller decompresses its body (compression id `compression`, `raw_len` bytes
  // uncompressed) and hands the payload back to `complete`. Its key and body point into the bytes given to add_copy.
  struct Pending {
    const uint8_t* key;
    std::size_t key_len;
    const uint8_t* body;
    std::size_t body_len;
    uint8_t header3[3];
    uint32_t crc;
    uint64_t raw_len;

    bool zstd() const { return compression_of(header3[2]) == kCompressionZstd; }
  };

  // The zstd bodies of `pending`, in order, each as a whole zstd frame (the magic number put back): the frames
  // concatenated, each one's (offset, length), and its payload's length: what a batched decompressor (zstandard's
  // multi_decompress_to_buffer) reads.
  struct ZstdFrames {
    std::vector<uint8_t> frames;
    std::vector<uint64_t> segments;
    std::vector<uint64_t> sizes;
  };
  static ZstdFrames zstd_frames(const std::vector<Pending>& pending);

  // Create `path` (it must not exist). Throws ReplicaError.
  ReplicaWriter(const std::string& path, int key_width, std::string identity);
  ~ReplicaWriter();
  ReplicaWriter(const ReplicaWriter&) = delete;
  ReplicaWriter& operator=(const ReplicaWriter&) = delete;

  // Parse the complete rows at the start of a binary COPY stream's bytes (its header first); a plain blob is stored at
  // once, a compressed one is appended to `pending` (its spans point into `data`, which must outlive them). Returns
  // the bytes consumed (the rest: an incomplete row). Throws ReplicaError for a stream that is not (key, tree) rows or
  // a key that is not n whole token ids.
  std::size_t add_copy(const uint8_t* data, std::size_t size, std::vector<Pending>& pending);
  // Store a pending row given its decompressed payload (nullptr: it did not decompress, the row is unreadable).
  void complete(const Pending& row, const uint8_t* payload, std::size_t size);
  // Write the slot table and the header, sync and close. Throws ReplicaError on an I/O error.
  void finish();

  uint64_t entries() const { return entries_.size(); }
  uint64_t unreadable() const { return unreadable_; }
  uint64_t records_bytes() const { return records_bytes_; }

 private:
  // A record: the key and its tree's payload with its token width (payload nullptr: the build's tree is unreadable).
  void add_record(const uint8_t* key, std::size_t key_len, int width, const uint8_t* payload, std::size_t size);
  void flush();
  void write_at(const uint8_t* data, std::size_t size, uint64_t offset);

  std::string path_;
  int fd_ = -1;
  int key_width_;
  std::string identity_;
  uint32_t ns_mask_ = 0;
  uint64_t unreadable_ = 0;
  uint64_t records_bytes_ = 0;
  bool copy_started_ = false, copy_ended_ = false;
  std::vector<uint8_t> buffer_;
  std::vector<std::pair<uint64_t, uint64_t>> entries_;  // (key hash, record offset)
  Tree scratch_;
};

}  // namespace crest
