// Python bindings of the native drafting core (nanobind): the module crest_native._core.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "codec.hpp"
#include "core.hpp"
#include "cut.hpp"
#include "features.hpp"

#ifndef CREST_SOURCE_DIGEST
#define CREST_SOURCE_DIGEST "unknown"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T>
using In1D = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out1D = nb::ndarray<nb::numpy, T, nb::ndim<1>>;
using Out2D = nb::ndarray<nb::numpy, double, nb::ndim<2>>;

template <typename T>
Out1D<T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out1D<T>(heap->data(), {heap->size()}, owner);
}

Out2D to_numpy_2d(std::vector<double>&& v, std::size_t rows, std::size_t cols) {
  auto* heap = new std::vector<double>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return Out2D(heap->data(), {rows, cols}, owner);
}

// Token ids (int64 or int32) as uint32, each checked against the vocabulary; `what` names the argument.
template <typename T>
std::vector<uint32_t> token_ids(const In1D<T>& a, const char* what, uint64_t vocab) {
  std::vector<uint32_t> out(a.shape(0));
  const T* p = a.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || static_cast<uint64_t>(p[i]) >= vocab)
      throw nb::value_error((std::string(what) + " holds token id " + std::to_string(p[i]) +
                             ", outside the tokenizer's vocabulary [0, " + std::to_string(vocab) +
                             "); tokenize with the datastore's tokenizer")
                                .c_str());
    out[i] = static_cast<uint32_t>(p[i]);
  }
  return out;
}

crest::RequestKey key_of(nb::handle h) {
  if (nb::isinstance<nb::bool_>(h) || !(nb::isinstance<nb::int_>(h) || nb::isinstance<nb::str>(h)))
    throw nb::type_error(("req_id " + std::string(nb::str(nb::repr(h)).c_str()) +
                          " is not an int or a str; key requests by an int or a str")
                             .c_str());
  if (nb::isinstance<nb::str>(h)) return std::string(nb::cast<std::string>(h));
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow)
    throw nb::value_error(("req_id " + std::string(nb::str(h).c_str()) + " is outside the 64-bit integers").c_str());
  return static_cast<int64_t>(v);
}

[[noreturn]] void not_active(nb::handle key) {
  throw nb::key_error(("request " + std::string(nb::str(nb::repr(key)).c_str()) +
                       " is not active; start_request it first")
                          .c_str());
}

nb::object key_object(const crest::RequestKey& k) {
  if (const auto* i = std::get_if<int64_t>(&k)) return nb::int_(*i);
  return nb::str(std::get<std::string>(k).c_str());
}

// A source tree passed as (ngram_len, token_ids uint32, parents int32, counts uint32, root_count); its arrays are held
// in `keep` while the step reads them.
struct Held {
  In1D<uint32_t> tokens;
  In1D<int32_t> parents;
  In1D<uint32_t> counts;
  In1D<double> probs;
};

crest::SourceTree source(nb::handle h, std::vector<Held>& keep) {
  nb::tuple t = nb::cast<nb::tuple>(h);
  if (t.size() != 5) throw nb::value_error("a source tree is (ngram_len, token_ids, parents, counts, root_count)");
  keep.push_back({nb::cast<In1D<uint32_t>>(t[1]), nb::cast<In1D<int32_t>>(t[2]), nb::cast<In1D<uint32_t>>(t[3])});
  const Held& held = keep.back();
  std::size_t n = held.tokens.shape(0);
  if (held.parents.shape(0) != n || held.counts.shape(0) != n)
    throw nb::value_error("a source tree's arrays differ in length");
  return {nb::cast<int>(t[0]), held.tokens.data(), held.parents.data(), held.counts.data(), n, nb::cast<uint64_t>(t[4])};
}

// The draft heads' tree passed as (token_ids uint32, parents int32, probs float64); held in `keep` like the others.
crest::SourceTree heads_tree(nb::handle h, std::vector<Held>& keep) {
  nb::tuple t = nb::cast<nb::tuple>(h);
  if (t.size() != 3) throw nb::value_error("a heads tree is (token_ids, parents, probs)");
  keep.push_back({nb::cast<In1D<uint32_t>>(t[0]), nb::cast<In1D<int32_t>>(t[1]), {}, nb::cast<In1D<double>>(t[2])});
  const Held& held = keep.back();
  std::size_t n = held.tokens.shape(0);
  if (held.parents.shape(0) != n || held.probs.shape(0) != n)
    throw nb::value_error("a heads tree's arrays differ in length");
  crest::SourceTree out{0, held.tokens.data(), held.parents.data(), nullptr, n, 0};
  out.probs = held.probs.data();
  return out;
}

// One request's step input: its datastore candidates (a list of source trees), live tree and heads tree (one each,
// or None).
crest::StepInput step_input(nb::handle key, int64_t budget, nb::handle stored, nb::handle live, nb::handle heads,
                            std::vector<Held>& keep) {
  crest::StepInput in;
  in.key = key_of(key);
  if (budget < 0 || budget > (1 << 20)) throw nb::value_error("budgets must be in 0..2**20");
  in.budget = static_cast<int>(budget);
  for (nb::handle c : nb::cast<nb::list>(stored)) in.candidates.push_back(source(c, keep));
  if (!live.is_none()) in.live = source(live, keep);
  if (!heads.is_none()) in.heads = heads_tree(heads, keep);
  return in;
}

std::size_t trees_in(nb::list stored) {
  std::size_t n = 0;
  for (nb::handle s : stored) n += nb::len(s) + 2;
  return n;
}

// Depths of a tree given by its parents (parents[i] in -1..i-1, checked).
std::vector<int32_t> depths_of(const In1D<int32_t>& parents) {
  std::vector<int32_t> d(parents.shape(0));
  for (std::size_t i = 0; i < d.size(); ++i) {
    int32_t p = parents.data()[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) throw nb::value_error("parents are not a tree: parents[i] in -1..i-1");
    d[i] = p < 0 ? 1 : d[p] + 1;
  }
  return d;
}

crest::Scored scored(const In1D<int32_t>& parents, const std::vector<int32_t>& depths, const In1D<double>& scores) {
  if (scores.shape(0) != parents.shape(0)) throw nb::value_error("parents and scores differ in length");
  return {parents.data(), depths.data(), scores.data(), parents.shape(0)};
}

nb::tuple drafts_tuple(std::vector<crest::Drafted>& out) {
  std::vector<int64_t> tokens, offsets{0}, chosen;
  std::vector<int32_t> parents;
  std::vector<double> scores;
  for (auto& d : out) {
    tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
    parents.insert(parents.end(), d.parents.begin(), d.parents.end());
    scores.insert(scores.end(), d.scores.begin(), d.scores.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
    chosen.push_back(d.chosen);
  }
  return nb::make_tuple(to_numpy(std::move(tokens)), to_numpy(std::move(parents)), to_numpy(std::move(scores)),
                        to_numpy(std::move(offsets)), to_numpy(std::move(chosen)));
}

crest::Options options_of(int64_t vocab_size, int local_depth, int match_nodes, int64_t outputs_bytes,
                          int outputs_depth, int context_tokens, nb::list sources) {
  if (outputs_bytes < 0 || vocab_size < 1) throw nb::value_error("outputs_bytes must be >= 0 and vocab_size >= 1");
  crest::Options o;
  o.vocab_size = static_cast<uint64_t>(vocab_size);
  o.local_depth = local_depth;
  o.match_nodes = match_nodes;
  o.outputs_bytes = static_cast<std::size_t>(outputs_bytes);
  o.outputs_depth = outputs_depth;
  o.context_tokens = context_tokens;
  for (bool& on : o.sources) on = false;
  for (nb::handle s : sources) {
    std::string name = nb::cast<std::string>(s);
    int k = 0;
    while (k < crest::kNumSources && name != crest::kSourceNames[k]) ++k;
    if (k == crest::kNumSources) throw nb::value_error(("unknown source '" + name + "'; see crest_native.SOURCES").c_str());
    o.sources[k] = true;
  }
  return o;
}

void bind_core(nb::module_& m);
void bind_requests(nb::class_<crest::Core>& core);
void bind_step(nb::class_<crest::Core>& core);

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The native drafting core of crest-spec (see crest_native and drafting.DraftingService).";
  nb::list features, sources;
  for (const auto& name : crest::feature_names()) features.append(nb::str(name.c_str()));
  for (const char* name : crest::kSourceNames) sources.append(nb::str(name));
  m.attr("FEATURES") = nb::tuple(features);
  m.attr("SOURCES") = nb::tuple(sources);
  m.attr("SOURCE_DIGEST") = CREST_SOURCE_DIGEST;

  m.def(
      "parse_tree_payload",
      [](nb::bytes payload, int width) {
        crest::Tree t;
        crest::parse_payload(reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), width, t);
        return nb::make_tuple(to_numpy(std::move(t.tokens)), to_numpy(std::move(t.parents)),
                              to_numpy(std::move(t.counts)), t.root_count);
      },
      "payload"_a, "width"_a);
  m.def(
      "chain_cut",
      [](In1D<int32_t> parents, In1D<double> scores, int max_len, double min_score) {
        if (max_len < 0) throw nb::value_error("max_len must be >= 0");
        auto depths = depths_of(parents);
        crest::CutScratch z;
        std::vector<int32_t> path;
        crest::chain_cut(scored(parents, depths, scores), max_len, min_score, z, path);
        return to_numpy(std::vector<int64_t>(path.begin(), path.end()));
      },
      "parents"_a, "scores"_a, "max_len"_a, "min_score"_a);
  m.def(
      "tree_cut",
      [](In1D<int32_t> parents, In1D<double> scores, int budget, double min_score) {
        if (budget < 0) throw nb::value_error("budget must be >= 0");
        auto depths = depths_of(parents);
        crest::CutScratch z;
        std::vector<int32_t> order, renumbered;
        crest::tree_cut(scored(parents, depths, scores), budget, min_score, z, order, renumbered);
        return nb::make_tuple(to_numpy(std::vector<int64_t>(order.begin(), order.end())),
                              to_numpy(std::move(renumbered)));
      },
      "parents"_a, "scores"_a, "budget"_a, "min_score"_a);
  bind_core(m);
}

namespace {

void bind_requests(nb::class_<crest::Core>& core) {
  core.def("start",
           [](crest::Core& c, nb::handle key, In1D<int64_t> prompt) {
             auto k = key_of(key);
             if (c.active(k))
               throw nb::value_error(("request " + std::string(nb::str(nb::repr(key)).c_str()) +
                                      " is already active; stop_request it first")
                                         .c_str());
             auto ids = token_ids(prompt, "prompt_ids", c.options().vocab_size);
             c.start(k, ids.data(), ids.size());
           })
      .def("extend",
           [](crest::Core& c, nb::handle key, In1D<int64_t> tokens) {
             auto k = key_of(key);
             if (!c.active(k)) not_active(key);
             auto ids = token_ids(tokens, "tokens", c.options().vocab_size);
             c.extend(k, ids.data(), ids.size());
           })
      .def("follow",
           [](crest::Core& c, nb::handle key, In1D<int32_t> tokens) {
             auto ids = token_ids(tokens, "tokens", c.options().vocab_size);
             return c.follow(key_of(key), ids.data(), ids.size());
           })
      .def("stop",
           [](crest::Core& c, nb::handle key) -> nb::object {
             std::vector<uint32_t> output;
             if (!c.stop(key_of(key), output)) return nb::none();
             return nb::cast(to_numpy(std::vector<int64_t>(output.begin(), output.end())));
           })
      .def("active", [](const crest::Core& c, nb::handle key) { return c.active(key_of(key)); })
      .def("keys",
           [](const crest::Core& c) {
             nb::list out;
             for (const auto& k : c.keys()) out.append(key_object(k));
             return out;
           });
}

void bind_step(nb::class_<crest::Core>& core) {
  core.def("draft",
           [](crest::Core& c, nb::list keys, In1D<int64_t> budgets, nb::list stored, nb::list live, nb::list heads,
              bool chain, double min_score) {
             std::size_t r = keys.size();
             if (budgets.shape(0) != r || stored.size() != r || live.size() != r || heads.size() != r)
               throw nb::value_error("keys, budgets, stored, live and heads must have one entry per request");
             std::vector<Held> keep;
             keep.reserve(trees_in(stored));  // the borrowed arrays stay put
             std::vector<crest::StepInput> inputs;
             for (std::size_t i = 0; i < r; ++i)
               inputs.push_back(step_input(keys[i], budgets.data()[i], stored[i], live[i], heads[i], keep));
             std::vector<crest::Drafted> out;
             c.draft(inputs, chain, min_score, out);
             return drafts_tuple(out);
           })
      .def("tables",
           [](crest::Core& c, nb::handle key, nb::list stored, nb::handle live, nb::handle heads) {
             std::vector<Held> keep;
             keep.reserve(nb::len(stored) + 2);
             crest::StepInput in = step_input(key, 0, stored, live, heads, keep);
             if (!c.active(in.key)) not_active(key);
             std::vector<crest::NodeTable> tables;
             c.tables(in, tables);
             nb::list out;
             for (auto& t : tables) {
               std::size_t n = t.shape.size();
               out.append(nb::make_tuple(to_numpy(std::move(t.shape.tokens)), to_numpy(std::move(t.shape.parents)),
                                         to_numpy(std::move(t.shape.depths)),
                                         to_numpy_2d(std::move(t.features), n, crest::kNumFeatures),
                                         to_numpy(std::move(t.scores))));
             }
             return out;
           },
           "key"_a, "stored"_a, "live"_a.none(), "heads"_a.none())
      .def("outputs_info",
           [](const crest::Core& c) {
             const auto& o = c.outputs();
             nb::dict d;
             d["outputs"] = o.num_outputs();
             d["bytes"] = o.nbytes();
             d["allocated"] = o.allocated();
             d["max_bytes"] = o.max_bytes();
             d["evictions"] = o.evictions;
             return d;
           })
      .def("__len__", [](const crest::Core& c) { return c.keys().size(); });
}

void bind_core(nb::module_& m) {
  nb::class_<crest::Core> core(m, "Core");
  core.def(
          "__init__",
          [](crest::Core* self, In1D<double> coef, double intercept, double prior, int64_t vocab_size,
             int local_depth, int match_nodes, int64_t outputs_bytes, int outputs_depth, int context_tokens,
             nb::list sources) {
            crest::Calibration cal{std::vector<double>(coef.data(), coef.data() + coef.shape(0)), intercept, prior};
            new (self) crest::Core(std::move(cal), options_of(vocab_size, local_depth, match_nodes, outputs_bytes,
                                                              outputs_depth, context_tokens, sources));
          },
          "coef"_a, "intercept"_a, "prior"_a, "vocab_size"_a, "local_depth"_a, "match_nodes"_a, "outputs_bytes"_a,
          "outputs_depth"_a, "context_tokens"_a, "sources"_a);
  bind_requests(core);
  bind_step(core);
}

}  // namespace
