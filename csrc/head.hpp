// The draft head's forward in the step (issue 69): from a row's final-normed hidden state at its last accepted token
// and its bonus token, an estimate of the next position's state, which scores.hpp's model features read against the
// LM head. EAGLE's feature-level step (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
// Uncertainty", section 3.1) as one residual MLP:
//
//   f^ = f + down^T silu(up^T [rms(f) * state_gain ; rms(E[x]) * token_gain] + up_bias) + down_bias
//
// with rms(v) = v / sqrt(mean(v^2) + 1e-6). The weights are trained in torch (evaluation.head_module.HeadModule, whose
// autograd the trainer needs) and held here packed in panels of columns, up and down in half precision (IEEE
// binary16, as the head's file stores them: a head loaded from its file computes exactly what float32 panels would,
// from half the memory an engine's forward pass has flushed from the caches); the core runs it on the step's own
// thread, their products summed in float32 registers, with AVX2, FMA and F16C where the CPU has them. A tile sums
// up to kRows rows against up to 4 panels at once (1 row x 4 panels, 2 x 2, or 4 x 1: eight independent sums in flight
// at any batch size, where one row against one panel waited on each FMA), each column summed over its panel's rows in
// order, so a row's estimate is the same bits whatever rows share its step. Its oracle is tests/oracle/head.py's
// float64 numpy reference over the half-precision weights, within float32 rounding (the FMA path rounds once where
// the plain one rounds twice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crest {

constexpr std::size_t kCols = 16;  // a weight panel's columns (two AVX2 vectors)
constexpr std::size_t kRows = 4;   // rows of the batch summed against a panel at once

struct Head {
  std::size_t d = 0, hidden = 0;
  std::vector<float> up_bias;  // [hidden]
  std::vector<float> down_bias, state_gain, token_gain;  // [d] each
  const float* embedding = nullptr;  // [vocab, d] the target's token embedding, borrowed
  std::size_t vocab = 0;
  // up [2d, hidden] and down [hidden, d], packed for the forward (pack): panels of kCols columns, each [rows, kCols]
  // contiguous, zero-padded, in binary16 (each weight rounded to nearest, ties to even); the only copy the core holds
  std::vector<uint16_t> up_panels, down_panels;

  // Packs up ([2d, hidden] row-major float32) and down ([hidden, d]) into their panels (d and hidden set; neither array
  // is kept), then checks the head (check): once, before the first forward.
  void pack(const float* up, const float* down);

  // Throws std::invalid_argument when the arrays do not fit one width d and one hidden width, or the embedding is
  // empty.
  void check() const;

  // The estimates of n rows: states [n, d] (row i's state), tokens [n] (its bonus token, < vocab), out [n, d].
  // scratch is resized as needed (kept by the caller between steps: no allocation in a steady step).
  void forward(const float* states, const uint32_t* tokens, std::size_t n, float* out,
               std::vector<float>& scratch) const;
};

// Whether the forward runs its AVX2, FMA and F16C kernel on this CPU (else the portable one).
bool head_uses_avx2();

// IEEE binary16 <-> float32: to_half rounds to nearest, ties to even (overflow to infinity, NaN kept NaN); from_half is
// exact.
uint16_t to_half(float value);
float from_half(uint16_t half);

}  // namespace crest
