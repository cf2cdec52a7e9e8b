// The engine's verdicts on a request's drafts, fed back into the goodput cut (csrc/goodput.hpp). The scores are
// calibrated offline for greedy decoding; an engine that samples (or a request off the calibration's domain) accepts
// fewer tokens than they promise, and a cut that trusts them drafts too long. SmartSpec keeps a moving average of each
// request's acceptance rate for the same reason (https://arxiv.org/abs/2406.14066, section 4.2).
//
// A verdict is one node's trial: at each depth of the last draft that the next committed tokens reach, the step's
// conditional score of the nodes there (their path scores over their parent's) is what was expected, and whether the
// committed token is one of them is what happened. The committed tokens are the target's own (greedy choices, or
// samples: a sampled token equals a drafted one with the probability rejection sampling accepts it), so the depths past
// what the engine verified are judged too, up to the first miss: a cut to no tokens still learns from the bonus token.
// Each request's ratio (accepted over expected, decayed per step) is shrunk towards the core-wide ratio, which new
// requests start from. Its Python oracle is tests/oracle/feedback.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crest {

// Decayed sums of trials: accepted (0/1 each) and expected (conditional scores).
struct Verdicts {
  double accepted = 0.0;
  double expected = 0.0;
};

constexpr double kRequestDecay = 0.9;   // a request's sums, per step judged
constexpr double kCoreDecay = 0.99;     // the core-wide sums, per step judged (of any request)
constexpr double kRequestPrior = 4.0;   // expected tokens' worth of the core-wide ratio in a request's
constexpr double kCorePrior = 16.0;     // expected tokens' worth of a ratio of 1 in the core-wide one

// Judge a draft (tokens, parents (-1: a child of the root; parents first), path scores; [n] each) against the `m`
// tokens committed after it, adding one step to `request` and to `core` (nothing when the draft or `m` is empty).
void judge(const int64_t* tokens, const int32_t* parents, const double* scores, std::size_t n, const uint32_t* next,
           std::size_t m, Verdicts& request, Verdicts& core);

// A request's acceptance ratio: its accepted over its expected, shrunk towards the core-wide ratio.
double acceptance_ratio(const Verdicts& request, const Verdicts& core);

// A chain's path scores with each conditional score multiplied by `ratio` (capped at 1): out[d] =
// out[d - 1] * min(1, ratio * scores[d] / scores[d - 1]).
void discount_chain(const double* scores, std::size_t n, double ratio, double* out);

}  // namespace crest
