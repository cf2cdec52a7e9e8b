// Token-tree payload parsing (codec v1, docs/tree-format.md), what datastore.codec.decode_tree calls once it has
// checked the header, decompressed the body and checked the CRC. Its Python oracle is tests/oracle/codec.py.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tree.hpp"

namespace crest {

// Parse an uncompressed payload with token ids `width` (1..4) bytes wide into `out`.
// Throws std::invalid_argument with datastore.codec's own message when the payload is not a valid tree.
void parse_payload(const uint8_t* data, std::size_t size, int width, Tree& out);

}  // namespace crest
