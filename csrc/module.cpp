// Python bindings of the native drafting core (nanobind): the module crest_native._core.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec.hpp"
#include "core.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T>
using In1D = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out1D = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

template <typename T>
Out1D<T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out1D<T>(heap->data(), {heap->size()}, owner);
}

std::vector<uint32_t> token_ids(const In1D<int64_t>& a, const char* what) {
  std::vector<uint32_t> out(a.shape(0));
  const int64_t* p = a.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || p[i] > 0xFFFFFFFFLL)
      throw std::invalid_argument(std::string(what) + " holds token id " + std::to_string(p[i]) +
                                  "; token ids are in [0, 2**32)");
    out[i] = static_cast<uint32_t>(p[i]);
  }
  return out;
}

// A source tree passed as (ngram_len, token_ids uint32, parents int32, counts uint32, root_count).
struct Held {
  In1D<uint32_t> tokens;
  In1D<int32_t> parents;
  In1D<uint32_t> counts;
};

crest::SourceTree source(nb::handle h, std::vector<Held>& keep) {
  nb::tuple t = nb::cast<nb::tuple>(h);
  if (t.size() != 5) throw std::invalid_argument("a source tree is (ngram_len, token_ids, parents, counts, root_count)");
  keep.push_back({nb::cast<In1D<uint32_t>>(t[1]), nb::cast<In1D<int32_t>>(t[2]), nb::cast<In1D<uint32_t>>(t[3])});
  const Held& held = keep.back();
  std::size_t n = held.tokens.shape(0);
  if (held.parents.shape(0) != n || held.counts.shape(0) != n)
    throw std::invalid_argument("a source tree's arrays differ in length");
  crest::SourceTree s;
  s.ngram_len = nb::cast<int>(t[0]);
  s.tokens = held.tokens.data();
  s.parents = held.parents.data();
  s.counts = held.counts.data();
  s.size = n;
  s.root_count = nb::cast<uint64_t>(t[4]);
  return s;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The native drafting core of crest-spec (see decoder.core.NativeCore and datastore.codec).";

  m.def(
      "parse_tree_payload",
      [](nb::bytes payload, int width) {
        crest::Tree t;
        crest::parse_payload(reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), width, t);
        return nb::make_tuple(to_numpy(std::move(t.tokens)), to_numpy(std::move(t.parents)),
                              to_numpy(std::move(t.counts)), t.root_count);
      },
      "payload"_a, "width"_a,
      "Parse an uncompressed token-tree payload (codec v1) whose token ids are `width` bytes wide into\n"
      "(token_ids uint32 [N], parents int32 [N], counts uint32 [N], root_count). Raises ValueError with\n"
      "datastore.codec's message when the payload is not a valid tree.");

  nb::class_<crest::Core>(m, "Core", "Requests' suffix automata, the output index and the calibrated merge.")
      .def(
          "__init__",
          [](crest::Core* self, In1D<double> coef, double intercept, double prior, int local_depth, int match_nodes,
             int64_t outputs_bytes, int outputs_depth, int context_tokens) {
            if (outputs_bytes < 0) throw std::invalid_argument("outputs_bytes must be >= 0");
            std::vector<double> c(coef.data(), coef.data() + coef.shape(0));
            new (self) crest::Core(c, intercept, prior, local_depth, match_nodes,
                                   static_cast<std::size_t>(outputs_bytes), outputs_depth, context_tokens);
          },
          "coef"_a, "intercept"_a, "prior"_a, "local_depth"_a, "match_nodes"_a, "outputs_bytes"_a,
          "outputs_depth"_a, "context_tokens"_a)
      .def(
          "start", [](crest::Core& c, In1D<int64_t> prompt) { return c.start(token_ids(prompt, "prompt_ids")); },
          "prompt"_a, "Index a new request's prompt (int64 [N]); returns its handle.")
      .def(
          "extend",
          [](crest::Core& c, int64_t handle, In1D<int64_t> tokens) { c.extend(handle, token_ids(tokens, "tokens")); },
          "handle"_a, "tokens"_a, "Append committed tokens (int64 [N]).")
      .def(
          "stop",
          [](crest::Core& c, int64_t handle) {
            auto out = c.stop(handle);
            return to_numpy(std::vector<int64_t>(out.begin(), out.end()));
          },
          "handle"_a, "Forget a request; its output (int64 [N]) goes into the output index and is returned.")
      .def(
          "context",
          [](const crest::Core& c, int64_t handle, int64_t n) {
            if (n < 0) throw std::invalid_argument("n must be >= 0");
            auto out = c.context(handle, static_cast<std::size_t>(n));
            return to_numpy(std::vector<int64_t>(out.begin(), out.end()));
          },
          "handle"_a, "n"_a, "The request's last n tokens (int64 [<= n]).")
      .def(
          "draft",
          [](crest::Core& c, In1D<int64_t> handles, In1D<int64_t> budgets, nb::list stored, nb::list live, bool chain,
             double min_score) {
            std::size_t r = handles.shape(0);
            if (budgets.shape(0) != r || stored.size() != r || live.size() != r)
              throw std::invalid_argument("handles, budgets, stored and live must have one entry per request");
            std::vector<Held> keep;
            std::size_t trees = 0;
            for (std::size_t i = 0; i < r; ++i) trees += nb::len(nb::handle(stored[i])) + 1;
            keep.reserve(trees);  // the borrowed arrays stay put
            std::vector<crest::StepInput> inputs(r);
            for (std::size_t i = 0; i < r; ++i) {
              auto& in = inputs[i];
              in.handle = handles.data()[i];
              int64_t b = budgets.data()[i];
              if (b < 1) throw std::invalid_argument("budgets must be >= 1");
              in.budget = static_cast<int>(b);
              for (nb::handle cand : nb::cast<nb::list>(stored[i])) in.candidates.push_back(source(cand, keep));
              if (!live[i].is_none()) {
                in.live = source(live[i], keep);
                in.has_live = true;
              }
            }
            std::vector<crest::Drafted> out = c.draft(inputs, chain, min_score);
            std::vector<int64_t> tokens, offsets{0}, chosen;
            std::vector<int32_t> parents;
            std::vector<double> scores, local_s, merge_s;
            for (auto& d : out) {
              tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
              parents.insert(parents.end(), d.parents.begin(), d.parents.end());
              scores.insert(scores.end(), d.scores.begin(), d.scores.end());
              offsets.push_back(static_cast<int64_t>(tokens.size()));
              chosen.push_back(d.chosen);
              local_s.push_back(d.local_s);
              merge_s.push_back(d.merge_s);
            }
            return nb::make_tuple(to_numpy(std::move(tokens)), to_numpy(std::move(parents)), to_numpy(std::move(scores)),
                                  to_numpy(std::move(offsets)), to_numpy(std::move(chosen)),
                                  to_numpy(std::move(local_s)), to_numpy(std::move(merge_s)));
          },
          "handles"_a, "budgets"_a, "stored"_a, "live"_a, "chain"_a, "min_score"_a,
          "One step: per request (handles int64 [R], budgets int64 [R] >= 1) the datastore's candidate trees\n"
          "(a list of (ngram_len, token_ids, parents, counts, root_count), longest first) and the live layer's\n"
          "(one such tuple or None). Returns (token_ids int64 [T], parents int32 [T], scores float64 [T],\n"
          "offsets int64 [R + 1], chosen int64 [R], local_s float64 [R], merge_s float64 [R]).")
      .def(
          "outputs_info",
          [](const crest::Core& c) {
            const auto& o = c.outputs();
            nb::dict d;
            d["outputs"] = o.num_outputs();
            d["bytes"] = o.nbytes();
            d["allocated"] = o.allocated();
            d["max_bytes"] = o.max_bytes();
            d["evictions"] = o.evictions;
            return d;
          },
          "The output index's figures: outputs, bytes (the size model its bound applies to), allocated (what its\n"
          "arrays hold allocated), max_bytes, evictions.")
      .def_prop_ro("active", &crest::Core::active, "Requests started and not stopped.");
}
