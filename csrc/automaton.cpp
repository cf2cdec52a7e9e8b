#include "automaton.hpp"

#include <algorithm>

namespace crest {

Automaton::Automaton() : table_(16, -1), mask_(15) { new_state(0, -1, 0); }

std::size_t Automaton::slot(int32_t state, uint32_t token) const {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | token;
  key *= 0x9E3779B97F4A7C15ULL;
  return static_cast<std::size_t>(key >> 32) & mask_;
}

int32_t Automaton::find(int32_t state, uint32_t token) const {
  for (std::size_t i = slot(state, token);; i = (i + 1) & mask_) {
    int32_t e = table_[i];
    if (e < 0) return -1;
    if (edges_[e].from == state && edges_[e].token == token) return e;
  }
}

void Automaton::grow_table() {
  std::vector<int32_t> old;
  old.swap(table_);
  table_.assign(old.size() * 2, -1);
  mask_ = table_.size() - 1;
  for (int32_t e : old) {
    if (e < 0) continue;
    std::size_t i = slot(edges_[e].from, edges_[e].token);
    while (table_[i] >= 0) i = (i + 1) & mask_;
    table_[i] = e;
  }
}

void Automaton::add_edge(int32_t state, uint32_t token, int32_t target) {
  if (2 * (edges_.size() + 1) > table_.size()) grow_table();
  int32_t e = static_cast<int32_t>(edges_.size());
  edges_.push_back({state, token, target, states_[state].head});
  states_[state].head = e;
  std::size_t i = slot(state, token);
  while (table_[i] >= 0) i = (i + 1) & mask_;
  table_[i] = e;
}

int32_t Automaton::new_state(int32_t len, int32_t link, uint32_t count) {
  states_.push_back({len, link, count, -1});
  return static_cast<int32_t>(states_.size()) - 1;
}

int32_t Automaton::clone(int32_t p, int32_t q, uint32_t token) {
  int32_t c = new_state(states_[p].len + 1, states_[q].link, states_[q].count);
  for (int32_t e = states_[q].head; e >= 0; e = edges_[e].next) add_edge(c, edges_[e].token, edges_[e].target);
  while (p >= 0) {
    int32_t e = find(p, token);
    if (e < 0 || edges_[e].target != q) break;
    edges_[e].target = c;
    p = states_[p].link;
  }
  states_[q].link = c;
  return c;
}

void Automaton::extend(const uint32_t* tokens, std::size_t n) {
  for (std::size_t k = 0; k < n; ++k) {
    uint32_t t = tokens[k];
    int32_t last = last_;
    int32_t cur;
    int32_t e = find(last, t);
    if (e >= 0) {  // the extended sequence already occurs (a later sequence of a shared automaton)
      int32_t q = edges_[e].target;
      cur = states_[q].len == states_[last].len + 1 ? q : clone(last, q, t);
    } else {
      cur = new_state(states_[last].len + 1, 0, 0);
      int32_t p = last;
      while (p >= 0 && find(p, t) < 0) {
        add_edge(p, t, cur);
        p = states_[p].link;
      }
      if (p >= 0) {
        int32_t q = edges_[find(p, t)].target;
        int32_t link = states_[p].len + 1 == states_[q].len ? q : clone(p, q, t);
        states_[cur].link = link;
      }
    }
    last_ = cur;
    for (int32_t v = cur; v > 0; v = states_[v].link) states_[v].count += 1;
    ++num_tokens_;
  }
}

std::pair<int32_t, int32_t> Automaton::repeated_suffix() const {
  if (last_ <= 0) return {0, 0};
  int32_t s = states_[last_].link;
  if (s <= 0) return {0, 0};
  return {s, states_[s].len};
}

void Automaton::step(int32_t& state, int32_t& matched, uint32_t token) const {
  int32_t e;
  while ((e = find(state, token)) < 0 && state > 0) {  // one lookup a state: the last one's edge is kept
    state = states_[state].link;
    matched = states_[state].len;
  }
  if (e < 0) {
    state = matched = 0;
  } else {
    state = edges_[e].target;
    matched += 1;
  }
}

void Automaton::clamp(int32_t& state, int32_t& matched, int32_t max_len) const {
  if (matched <= max_len) return;
  matched = max_len;
  while (states_[state].link > 0 && states_[states_[state].link].len >= max_len) state = states_[state].link;
}

std::pair<int32_t, int32_t> Automaton::match(const uint32_t* context, std::size_t n) const {
  int32_t state = 0, matched = 0;
  for (std::size_t k = 0; k < n; ++k) step(state, matched, context[k]);
  return {state, matched};
}

namespace {
struct Candidate {
  uint32_t count;
  int32_t parent;
  uint32_t token;
  int32_t state;
  int32_t depth;
};
struct Worse {  // the priority queue's top is the best: the highest count, then the earlier parent, the smaller token
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.count != b.count) return a.count < b.count;
    if (a.parent != b.parent) return a.parent > b.parent;
    return a.token > b.token;
  }
};
}  // namespace

void Automaton::continuations(int32_t state, int budget, int max_depth, uint32_t own, Tree& out) const {
  out.clear();
  thread_local std::vector<Candidate> heap, kids;  // scratch, reused
  heap.clear();
  const Worse worse;
  // Push the `room` best children of `from` (count desc, then token asc: the heap's order among siblings). A worse one
  // can never be taken: its `room` better siblings are taken first, and at most `room` more nodes are taken.
  auto push_children = [&](int32_t from, int32_t parent, int32_t depth, std::size_t room) {
    kids.clear();
    for (int32_t e = states_[from].head; e >= 0; e = edges_[e].next) {
      const State& kid = states_[edges_[e].target];
      // a hint: the kid's first edge, read if it is taken (on caches a forward pass flushed, each edge is a miss)
      if (kid.head >= 0) __builtin_prefetch(&edges_[static_cast<std::size_t>(kid.head)]);
      kids.push_back({kid.count, parent, edges_[e].token, edges_[e].target, depth});
    }
    if (kids.size() > room) {
      std::nth_element(kids.begin(), kids.begin() + static_cast<std::ptrdiff_t>(room), kids.end(),
                       [&](const Candidate& a, const Candidate& b) { return worse(b, a); });
      kids.resize(room);
    }
    for (const Candidate& c : kids) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), worse);
    }
  };
  if (budget > 0) push_children(state, -1, 1, static_cast<std::size_t>(budget));
  uint64_t top = 0;
  while (!heap.empty() && static_cast<int>(out.tokens.size()) < budget) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    Candidate c = heap.back();
    heap.pop_back();
    int32_t idx = static_cast<int32_t>(out.tokens.size());
    out.tokens.push_back(c.token);
    out.parents.push_back(c.parent);
    out.counts.push_back(c.count);
    if (c.parent < 0) top += c.count;
    std::size_t room = static_cast<std::size_t>(budget) - out.tokens.size();
    if (c.depth < max_depth && room > 0) push_children(c.state, idx, c.depth + 1, room);
  }
  int64_t mine = static_cast<int64_t>(states_[state].count) - static_cast<int64_t>(own);
  out.root_count = std::max<int64_t>(mine, static_cast<int64_t>(top));
}

}  // namespace crest
