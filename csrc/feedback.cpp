#include "feedback.hpp"

#include <algorithm>

namespace crest {

void judge(const int64_t* tokens, const int32_t* parents, const double* scores, std::size_t n, const uint32_t* next,
           std::size_t m, Verdicts& request, Verdicts& core) {
  if (n == 0 || m == 0) return;
  double accepted = 0.0, expected = 0.0;
  int32_t at = -1;       // the node reached (-1: the root)
  double reached = 1.0;  // its path score
  for (std::size_t d = 0; d < m; ++d) {
    double mass = 0.0;  // the children's path scores
    int32_t hit = -1;
    for (std::size_t i = static_cast<std::size_t>(at + 1); i < n; ++i) {  // children come after their parent
      if (parents[i] != at) continue;
      mass += scores[i];
      if (tokens[i] == static_cast<int64_t>(next[d])) hit = static_cast<int32_t>(i);
    }
    if (mass <= 0.0) break;  // no child: nothing was drafted at this depth
    expected += reached > 0.0 ? std::min(1.0, mass / reached) : 0.0;
    if (hit < 0) break;
    accepted += 1.0;
    at = hit;
    reached = scores[hit];
  }
  if (expected <= 0.0) return;
  request.accepted = request.accepted * kRequestDecay + accepted;
  request.expected = request.expected * kRequestDecay + expected;
  core.accepted = core.accepted * kCoreDecay + accepted;
  core.expected = core.expected * kCoreDecay + expected;
}

double acceptance_ratio(const Verdicts& request, const Verdicts& core) {
  const double fleet = (core.accepted + kCorePrior) / (core.expected + kCorePrior);
  return (request.accepted + kRequestPrior * fleet) / (request.expected + kRequestPrior);
}

void discount_chain(const double* scores, std::size_t n, double ratio, double* out) {
  double parent = 1.0, kept = 1.0;
  for (std::size_t d = 0; d < n; ++d) {
    const double step = parent > 0.0 ? scores[d] / parent : 0.0;
    kept *= std::min(1.0, ratio * step);
    out[d] = kept;
    parent = scores[d];
  }
}

}  // namespace crest
