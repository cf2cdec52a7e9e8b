// Stage 3 of drafting: the merge. The sources' trees below the same root (the sequence's last token) become one
// node table: the first present source whole, in its node order, then each later source's nodes not yet present,
// each after its parent (the union of retrieved token trees, as REST's and CREST's drafters merge the trees of
// several matches: REST section 3.2, https://arxiv.org/abs/2311.08252; CREST section 3,
// https://arxiv.org/abs/2408.04678). Its Python oracle is tests/oracle/treeops.py `union`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tree.hpp"

namespace crest {

// (merged parent + 1, token) -> merged node, open addressing; reset per merge, its memory kept.
class ChildMap {
 public:
  void reset(std::size_t capacity);
  int32_t* find_or_slot(int64_t parent, uint32_t token);  // the node's slot (-1: not there yet, fill it)

 private:
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  std::size_t mask_ = 0;
};

// The merged node table's shape: tokens, parents (-1: a child of the root; parents first) and depths (1 for a child
// of the root); `where[k]`: the merged node of each node of source k (-1: deeper than the merge's depth limit).
struct Union {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents, depths;
  std::vector<std::vector<int32_t>> where;
  std::size_t size() const { return tokens.size(); }
};

// Merge `sources` (one entry per source; nullptr or no nodes: absent) into `out`, leaving out the nodes deeper than
// `max_depth` (a draft of at most `max_depth` nodes, chain or tree, never holds one: a node's ancestors score at least
// as high, and the cut takes shallower nodes first; no kept node's features depend on them); false when no source has a
// node. Throws std::invalid_argument when a source's parents are not a tree (parents[i] in -1..i-1).
bool merge(const std::vector<const SourceTree*>& sources, ChildMap& children, Union& out, int max_depth);

// The live layer's tree for one context, read from its two builds: `main`'s (the outputs folded in) and `delta`'s (the
// outputs appended since, compacted on their own; size 0: none). The longer match alone, as the more specific
// context; at equal lengths, the count-summed union: `main`'s nodes in order, then `delta`'s new nodes, each after its
// parent, counts (and root counts, when both are known) added, as one build over both sets of outputs counts the
// context, but for the top-t choice each build made alone. The result borrows `main`, `delta` or `sum` (where a sum is
// written; `where` is scratch, its memory kept between calls). Its Python oracle is tests/oracle/treeops.py
// `live_layer`.
SourceTree live_layer(const SourceTree& main, const SourceTree& delta, ChildMap& children, Tree& sum,
                      std::vector<int32_t>& where);

}  // namespace crest
