// Token-tree blobs, codec v1 (docs/tree-format.md): the header, the CRC and the payload, checked and parsed here once.
// datastore.codec.decode_tree reads the header here, decompresses the body in Python (zstd, lz4) and hands the payload
// back for its length, CRC and parse; a replica's records (replica.hpp) hold a tree's payload, checked by the replica
// and parsed here. Its Python oracle is tests/oracle/codec.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tree.hpp"

namespace crest {

constexpr uint8_t kBlobMagic = 0xC7;
constexpr uint8_t kBlobVersion = 1;
constexpr std::size_t kBlobFixedHeader = 7;  // magic, version, flags, CRC-32
constexpr uint64_t kMaxPayload = 1ULL << 24;  // guards decompression bombs

// A blob's compression id (the high nibble of its third byte), named once: datastore.codec and datastore.replica read
// these numbers from crest_native.COMPRESSION_IDS. A zstd body is stored magicless (the frame's magic number cut).
enum Compression : int { kCompressionNone = 0, kCompressionZstd = 1, kCompressionLz4 = 2 };

// The compression id a header's third byte holds.
inline int compression_of(uint8_t flags) { return flags >> 4; }

// A blob's header: compression id (a Compression), token width, CRC-32, the payload's length and where the body
// starts.
struct BlobHeader {
  int compression = 0;
  int width = 0;
  uint32_t crc = 0;
  uint64_t raw_len = 0;
  std::size_t body = 0;
};

// The header of `blob`. Throws std::invalid_argument with datastore.codec's messages (too short, magic, version,
// token width, length varint, payload limit, compression id).
BlobHeader parse_blob_header(const uint8_t* blob, std::size_t size);

// CRC-32 (zlib's) of a header's first three bytes followed by a payload: what the header's CRC field holds.
uint32_t blob_crc(const uint8_t* header3, const uint8_t* payload, std::size_t size);

// The payload of the blob whose header is `h` (its first three bytes at `header3`), checked against the header's length
// and CRC, parsed into `out`. Throws std::invalid_argument with datastore.codec's messages.
void parse_checked(const uint8_t* header3, const BlobHeader& h, const uint8_t* payload, std::size_t size, Tree& out);

// Parse an uncompressed payload with token ids `width` (1..4) bytes wide into `out`.
// Throws std::invalid_argument with datastore.codec's own message when the payload is not a valid tree.
void parse_payload(const uint8_t* data, std::size_t size, int width, Tree& out);

// An unsigned LEB128 varint at data[pos], advancing pos. Throws std::invalid_argument when it is cut off or too long.
uint64_t read_varint(const uint8_t* data, std::size_t size, std::size_t& pos);
void append_varint(uint64_t value, std::vector<uint8_t>& out);

}  // namespace crest
