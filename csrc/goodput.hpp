// How many of a step's draft nodes an engine should verify: the batch's goodput on the engine's measured step-cost
// curve (SmartSpec, "Optimizing Speculative Decoding for Serving Large Language Models Using Goodput",
// https://arxiv.org/abs/2406.14066, section 4). A node scoring p (its path probability) adds p expected tokens; `rows`
// rows keeping their n best-scored nodes emit rows + S(n) tokens in T(rows + n) seconds, and the n maximising
// (rows + S(n)) / T(rows + n) is kept; a step that verifies any draft token also pays `jump` seconds once (an engine's
// speculative sampling: vLLM runs its rejection sampler only for a step with drafts), so n >= 1 costs
// T(rows + n) + jump. The Python oracle is tests/oracle/goodput.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crest {

// T(N), an engine step's seconds verifying N tokens without drafts (borrowed arrays, [points] each, tokens
// increasing): interpolated between points, flat below the first, `tail` seconds per token past the last; `jump`, the
// seconds a step pays once when it verifies any draft token.
struct StepCurve {
  const double* tokens;
  const double* seconds;
  std::size_t points;
  double tail;
  double jump = 0;
  double at(double n) const;
};

// The n best-scored of `nodes` scores (score desc, then index asc) that maximise the goodput of `rows` rows (the
// fewest on a tie): keep[i] = 1 for those, 0 for the rest. Along a chain, whose scores never rise, they are a prefix.
// `order` is scratch. Returns n.
std::size_t goodput_keep(const double* scores, std::size_t nodes, int64_t rows, const StepCurve& curve,
                         std::vector<uint8_t>& keep, std::vector<int32_t>& order);

}  // namespace crest
