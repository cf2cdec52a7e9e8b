#include "codec.hpp"

#include <zlib.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace crest {

uint64_t read_varint(const uint8_t* data, std::size_t size, std::size_t& pos) {
  uint64_t value = 0;
  int shift = 0;
  while (true) {
    if (pos >= size) throw std::invalid_argument("payload ends inside a varint");
    uint8_t byte = data[pos++];
    uint64_t bits = byte & 0x7F;
    if (byte < 0x80) {
      if (shift == 63 && bits > 1) throw std::invalid_argument("varint value exceeds 64 bits");
      return value | (bits << shift);
    }
    value |= bits << shift;
    shift += 7;
    if (shift > 63) throw std::invalid_argument("varint longer than 10 bytes");
  }
}

void append_varint(uint64_t value, std::vector<uint8_t>& out) {
  while (value >= 0x80) {
    out.push_back(static_cast<uint8_t>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<uint8_t>(value));
}

BlobHeader parse_blob_header(const uint8_t* blob, std::size_t size) {
  if (size < kBlobFixedHeader + 1)
    throw std::invalid_argument("blob of " + std::to_string(size) + " bytes is shorter than the " +
                                std::to_string(kBlobFixedHeader + 1) + "-byte header");
  if (blob[0] != kBlobMagic) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "%02x", blob[0]);
    throw std::invalid_argument(std::string("bad magic byte 0x") + hex + "; this is not a token tree blob");
  }
  if (blob[1] != kBlobVersion)
    throw std::invalid_argument("tree format version " + std::to_string(blob[1]) +
                                " is not supported (this build reads version " + std::to_string(kBlobVersion) + ")");
  BlobHeader h;
  h.compression = compression_of(blob[2]);
  h.width = blob[2] & 0x0F;
  if (h.width < 1 || h.width > 4)
    throw std::invalid_argument("token width " + std::to_string(h.width) + " is outside 1..4");
  h.crc = static_cast<uint32_t>(blob[3]) | static_cast<uint32_t>(blob[4]) << 8 | static_cast<uint32_t>(blob[5]) << 16 |
          static_cast<uint32_t>(blob[6]) << 24;
  std::size_t pos = kBlobFixedHeader;
  h.raw_len = read_varint(blob, size, pos);
  if (h.raw_len > kMaxPayload)
    throw std::invalid_argument("payload length " + std::to_string(h.raw_len) + " exceeds the " +
                                std::to_string(kMaxPayload) + "-byte limit");
  if (h.compression > kCompressionLz4) throw std::invalid_argument("unknown compression id " + std::to_string(h.compression));
  h.body = pos;
  return h;
}

uint32_t blob_crc(const uint8_t* header3, const uint8_t* payload, std::size_t size) {
  uLong crc = crc32(crc32(0L, Z_NULL, 0), header3, 3);
  return static_cast<uint32_t>(crc32(crc, payload, static_cast<uInt>(size)));
}

void parse_checked(const uint8_t* header3, const BlobHeader& h, const uint8_t* payload, std::size_t size, Tree& out) {
  if (size != h.raw_len)
    throw std::invalid_argument("payload is " + std::to_string(size) + " bytes, header says " +
                                std::to_string(h.raw_len));
  if (blob_crc(header3, payload, size) != h.crc) throw std::invalid_argument("CRC mismatch: the blob is corrupt");
  parse_payload(payload, size, h.width, out);
}

void parse_payload(const uint8_t* data, std::size_t size, int width, Tree& out) {
  if (width < 1 || width > 4) throw std::invalid_argument("token width " + std::to_string(width) + " is outside 1..4");
  out.clear();
  std::size_t pos = 0;
  uint64_t n = read_varint(data, size, pos);
  uint64_t root = read_varint(data, size, pos);
  if (n > size || pos + n * static_cast<uint64_t>(width) > size)
    throw std::invalid_argument("payload too short for " + std::to_string(n) + " token ids");
  out.tokens.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t t = 0;
    for (int b = 0; b < width; ++b) t |= static_cast<uint32_t>(data[pos + i * width + b]) << (8 * b);
    out.tokens[i] = t;
  }
  pos += n * width;
  thread_local std::vector<uint64_t> codes, counts;  // scratch, reused
  codes.resize(n);
  counts.resize(n);
  for (uint64_t i = 0; i < n; ++i) codes[i] = read_varint(data, size, pos);
  for (uint64_t i = 0; i < n; ++i) counts[i] = read_varint(data, size, pos);
  if (pos != size) throw std::invalid_argument(std::to_string(size - pos) + " trailing bytes after the tree payload");
  out.counts.resize(n);
  out.parents.resize(n);
  int64_t prev = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t code = codes[i];
    prev += static_cast<int64_t>(code >> 1) ^ -static_cast<int64_t>(code & 1);  // unzigzag, undo the delta
    int64_t parent = prev - 1;
    if (parent < -1 || parent >= static_cast<int64_t>(i))
      throw std::invalid_argument("decoded arrays are not a valid tree: node " + std::to_string(i) + " has parent " +
                                  std::to_string(parent));
    if (counts[i] > 0xFFFFFFFFULL || (parent >= 0 && counts[i] > counts[parent]))
      throw std::invalid_argument("decoded arrays are not a valid tree: node " + std::to_string(i) +
                                  " counts more than its parent");
    out.parents[i] = static_cast<int32_t>(parent);
    out.counts[i] = static_cast<uint32_t>(counts[i]);
  }
  out.root_count = root;
}

}  // namespace crest
