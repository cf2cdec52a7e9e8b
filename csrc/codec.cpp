#include "codec.hpp"

#include <stdexcept>
#include <string>

namespace crest {

namespace {

uint64_t varint(const uint8_t* data, std::size_t size, std::size_t& pos) {
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

}  // namespace

void parse_payload(const uint8_t* data, std::size_t size, int width, Tree& out) {
  if (width < 1 || width > 4) throw std::invalid_argument("token width " + std::to_string(width) + " is outside 1..4");
  out.clear();
  std::size_t pos = 0;
  uint64_t n = varint(data, size, pos);
  uint64_t root = varint(data, size, pos);
  if (n > size || pos + n * static_cast<uint64_t>(width) > size)
    throw std::invalid_argument("payload too short for " + std::to_string(n) + " token ids");
  out.tokens.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t t = 0;
    for (int b = 0; b < width; ++b) t |= static_cast<uint32_t>(data[pos + i * width + b]) << (8 * b);
    out.tokens[i] = t;
  }
  pos += n * width;
  std::vector<uint64_t> codes(n);
  for (uint64_t i = 0; i < n; ++i) codes[i] = varint(data, size, pos);
  out.counts.resize(n);
  out.parents.resize(n);
  std::vector<uint64_t> counts(n);
  for (uint64_t i = 0; i < n; ++i) counts[i] = varint(data, size, pos);
  if (pos != size) throw std::invalid_argument(std::to_string(size - pos) + " trailing bytes after the tree payload");
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
