// Stages 6 and 7 of drafting: the cut of a scored tree (parents first, scores never rising along a path) to what one
// verification step checks. Both drop nodes scoring below `min_score`, a node's verification cost in accepted
// tokens, so a draft stops where its expected gain does (the goodput argument of SmartSpec,
// https://arxiv.org/abs/2406.14066). Their Python oracles are tests/oracle/treeops.py `best_path` and `top_nodes`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crest {

// A scored tree's arrays (borrowed), [n] each: parents (-1: a child of the root; parents first), depths (1 for a
// child of the root) and scores.
struct Scored {
  const int32_t* parents;
  const int32_t* depths;
  const double* scores;
  std::size_t n;
};

// Scratch a cut reuses between steps.
struct CutScratch {
  std::vector<double> sum;
  std::vector<uint8_t> reached;
  std::vector<int32_t> order, renumber;
};

// Stage 6, for chain verifiers: the root path of at most `max_len` nodes, each scoring at least `min_score`, with the
// largest sum of scores (its expected accepted length; ties: the earlier node). `path` gets its nodes, root first.
void chain_cut(const Scored& t, int max_len, double min_score, CutScratch& z, std::vector<int32_t>& path);

// Stage 7, for tree verifiers: the best `budget` nodes (score desc, depth asc, node order), those scoring below
// `min_score` dropped; prefix-closed, every parent before its children. `order` gets the kept nodes, `parents`
// their parents renumbered to positions in `order`.
void tree_cut(const Scored& t, int budget, double min_score, CutScratch& z, std::vector<int32_t>& order,
              std::vector<int32_t>& parents);

}  // namespace crest
