// What the binding files of crest_native._core share (nanobind): the array types they convert, the read-only arrays
// they hand back, and the step-cost curve a step and goodput_keep both take. Each binding file converts its
// arguments and calls csrc/; the values a step is handed are checked by crest::Core::step itself, and what only
// Python can see (request ids, token lists) by drafting.door.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "codec.hpp"
#include "core.hpp"
#include "cut.hpp"
#include "features.hpp"
#include "goodput.hpp"
#include "replica.hpp"

namespace crest_bind {

namespace nb = nanobind;

template <typename T>
using In1D = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using In2D = nb::ndarray<const T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out1D = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A read-only array owning `v` (numpy's writeable flag off).
template <typename T>
inline Out1D<const T> owned(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  heap->reserve(1);  // never a null pointer: an empty array with none would be exported as a new, writeable one
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out1D<const T>(heap->data(), {heap->size()}, owner);
}

inline nb::tuple tree_tuple(crest::Tree&& t) {
  uint64_t root = t.root_count;
  return nb::make_tuple(owned(std::move(t.tokens)), owned(std::move(t.parents)), owned(std::move(t.counts)), root);
}

// An engine's step-cost curve (drafting.CostCurve), checked when it is made.
struct Curve {
  In1D<double> tokens, seconds;
  double tail, draft_s;
  crest::StepCurve view() const { return {tokens.data(), seconds.data(), tokens.shape(0), tail, draft_s}; }
};

// A draft head (crest_native.Head): its weights, copied into the core's float32 arrays, and the token embedding it
// reads, borrowed and held here.
struct HeadHandle {
  std::shared_ptr<crest::Head> head;
  nb::object embedding;
};

// An engine's rows (drafting.EngineRows): their ids and counts as the engine holds them, not copied.
struct Rows {
  using Ids = nb::ndarray<nb::ro, nb::ndim<2>, nb::c_contig, nb::device::cpu>;  // read only: writeable or not
  using Counts = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  Ids ids;
  Counts lengths;
  nb::object index;  // In1D<int64_t> or None
  int64_t limit;
};

// The trees a round trip looked up, per row: its datastore candidates (a list) and its live layer's main and delta
// trees (each a tree or None), each tree (ngram_len, token_ids uint32, parents int32, counts uint32, root_count).
struct Trees {
  std::vector<In1D<uint32_t>> tokens, counts;  // held while a step reads them
  std::vector<In1D<int32_t>> parents;
  crest::GivenTrees given;

  crest::SourceTree tree(nb::handle h) {
    nb::tuple t = nb::cast<nb::tuple>(h);
    tokens.push_back(nb::cast<In1D<uint32_t>>(t[1]));
    parents.push_back(nb::cast<In1D<int32_t>>(t[2]));
    counts.push_back(nb::cast<In1D<uint32_t>>(t[3]));
    return {nb::cast<int>(t[0]), tokens.back().data(), parents.back().data(), counts.back().data(),
            tokens.back().shape(0), nb::cast<uint64_t>(t[4])};
  }
};

// The host-local replicas of each datastore set a step reads (crest_native.StoreSets): per set, its datastores' (a
// request's own, then the shared one), its live layer's and its delta's, each a Replica or None; held while a step
// reads them.
struct StoreSets {
  std::vector<crest::StoreSet> sets;
  nb::list held;
};

void bind_options(nb::module_& m);
void bind_inputs(nb::module_& m);
void bind_core(nb::module_& m);
void bind_replicas(nb::module_& m);
void bind_functions(nb::module_& m);
void bind_constants(nb::module_& m);

}  // namespace crest_bind
