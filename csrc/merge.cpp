#include "merge.hpp"

#include <algorithm>
#include <stdexcept>

namespace crest {

void ChildMap::reset(std::size_t capacity) {
  std::size_t want = 16;
  while (want < 2 * capacity) want <<= 1;
  if (keys_.size() < want) {
    keys_.assign(want, 0);
    values_.assign(want, -1);
  } else {  // only the slots this call hashes into: a map once grown for a large tree is not cleared whole each time
    std::fill_n(values_.begin(), want, -1);
  }
  mask_ = want - 1;
}

int32_t* ChildMap::find_or_slot(int64_t parent, uint32_t token) {
  uint64_t key = (static_cast<uint64_t>(parent + 1) << 32) | token;
  for (std::size_t i = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> 40) & mask_;; i = (i + 1) & mask_) {
    if (values_[i] < 0) {
      keys_[i] = key;
      return &values_[i];
    }
    if (keys_[i] == key) return &values_[i];
  }
}

namespace {

// Walk one source's nodes into the union: each node joins its parent's merged node; `base` (the first source) keeps
// every node, in order (a repeated sibling: the later one is found), a later source adds only new nodes.
void add_source(const SourceTree& s, bool base, int max_depth, ChildMap& children, Union& u,
                std::vector<int32_t>& where) {
  where.assign(s.size, 0);
  for (std::size_t i = 0; i < s.size; ++i) {
    int32_t p = s.parents[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) throw std::invalid_argument("a source tree's parents are not a tree");
    int64_t up = p < 0 ? -1 : where[p];
    if ((p >= 0 && up < 0) || (up >= 0 && u.depths[up] >= max_depth)) {  // below the depth limit: left out
      where[i] = -1;
      continue;
    }
    int32_t* slot = children.find_or_slot(up, s.tokens[i]);
    if (base || *slot < 0) {
      int32_t node = static_cast<int32_t>(u.tokens.size());
      u.tokens.push_back(s.tokens[i]);
      u.parents.push_back(static_cast<int32_t>(up));
      u.depths.push_back(up < 0 ? 1 : u.depths[up] + 1);
      *slot = node;
    }
    where[i] = *slot;
  }
}

}  // namespace

bool merge(const std::vector<const SourceTree*>& sources, ChildMap& children, Union& out, int max_depth) {
  std::size_t total = 0;
  for (const SourceTree* s : sources) total += s ? s->size : 0;
  out.tokens.clear();
  out.parents.clear();
  out.depths.clear();
  out.where.resize(sources.size());
  if (total == 0) return false;
  children.reset(total);
  bool base = true;
  for (std::size_t k = 0; k < sources.size(); ++k) {
    if (!sources[k] || sources[k]->size == 0) continue;
    add_source(*sources[k], base, max_depth, children, out, out.where[k]);
    base = false;
  }
  return true;
}

SourceTree live_layer(const SourceTree& main, const SourceTree& delta, ChildMap& children, Tree& sum,
                      std::vector<int32_t>& where) {
  if (delta.size == 0 || (main.size && main.ngram_len > delta.ngram_len)) return main;
  if (main.size == 0 || delta.ngram_len > main.ngram_len) return delta;
  sum.clear();
  children.reset(main.size + delta.size);
  where.assign(delta.size, 0);
  for (std::size_t i = 0; i < main.size; ++i) {
    sum.tokens.push_back(main.tokens[i]);
    sum.parents.push_back(main.parents[i]);
    sum.counts.push_back(main.counts[i]);
    *children.find_or_slot(main.parents[i], main.tokens[i]) = static_cast<int32_t>(i);
  }
  for (std::size_t j = 0; j < delta.size; ++j) {
    int32_t p = delta.parents[j];
    if (p < -1 || p >= static_cast<int32_t>(j)) throw std::invalid_argument("a source tree's parents are not a tree");
    int32_t up = p < 0 ? -1 : where[p];
    int32_t* slot = children.find_or_slot(up, delta.tokens[j]);
    if (*slot < 0) {
      *slot = static_cast<int32_t>(sum.tokens.size());
      sum.tokens.push_back(delta.tokens[j]);
      sum.parents.push_back(up);
      sum.counts.push_back(0);
    }
    sum.counts[*slot] += delta.counts[j];
    where[j] = *slot;
  }
  sum.root_count = main.root_count && delta.root_count ? main.root_count + delta.root_count : 0;
  return SourceTree::of(sum, main.ngram_len);
}

}  // namespace crest
