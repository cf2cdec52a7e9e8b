#include "output_index.hpp"

namespace crest {

std::size_t OutputIndex::allocated() const {
  std::size_t kept = 0;
  for (const auto& o : outputs_) kept += o.capacity() * sizeof(uint32_t);
  return automaton_.allocated() + kept;
}

void OutputIndex::add(const std::vector<uint32_t>& tokens) {
  if (tokens.empty() || max_bytes_ == 0) return;
  ++version_;
  outputs_.push_back(tokens);
  automaton_.start_sequence();
  automaton_.extend(tokens.data(), tokens.size());
  if (automaton_.nbytes() > max_bytes_) evict();
}

void OutputIndex::evict() {
  using wide = unsigned __int128;
  const wide size = automaton_.nbytes(), tokens = automaton_.num_tokens(), target = max_bytes_ / 2;
  std::size_t keep = 0;
  wide held = 0;
  for (auto it = outputs_.rbegin(); it != outputs_.rend(); ++it) {  // newest first, sizes pro rata to tokens
    if ((held + it->size()) * size > target * tokens) break;
    held += it->size();
    ++keep;
  }
  evicted += static_cast<int64_t>(outputs_.size() - keep);
  evictions += 1;
  while (outputs_.size() > keep) outputs_.pop_front();
  automaton_ = Automaton();
  for (const auto& out : outputs_) {
    automaton_.start_sequence();
    automaton_.extend(out.data(), out.size());
  }
}

bool OutputIndex::follow(OutputMatch& m, const uint32_t* tokens, std::size_t n, std::size_t window, int budget,
                         Tree& out, int& length) const {
  if (m.version != version_ || m.pos > n) {  // the index changed: match the window afresh
    std::size_t from = n - std::min(n, window);
    auto [state, len] = automaton_.match(tokens + from, n - from);
    m = {version_, n, state, len};
  } else {
    for (std::size_t k = m.pos; k < n; ++k) automaton_.step(m.state, m.length, tokens[k]);
    automaton_.clamp(m.state, m.length, static_cast<int32_t>(window));
    m.pos = n;
  }
  length = m.length;
  out.clear();
  if (m.length == 0) return false;
  automaton_.continuations(m.state, budget, max_depth_, 0, out);
  return !out.tokens.empty();
}

bool OutputIndex::match(const uint32_t* context, std::size_t n, int budget, Tree& out, int& length) const {
  auto [state, len] = automaton_.match(context, n);
  length = len;
  out.clear();
  if (len == 0) return false;
  automaton_.continuations(state, budget, max_depth_, 0, out);
  return !out.tokens.empty();
}

}  // namespace crest
