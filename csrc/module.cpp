// Python bindings of the native drafting core (nanobind): the module crest_native._core. The callers (drafting.door,
// datastore.replica, datastore.codec) check every argument first; these bindings convert and trust them.
#include <algorithm>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "codec.hpp"
#include "core.hpp"
#include "cut.hpp"
#include "features.hpp"
#include "goodput.hpp"
#include "replica.hpp"

#ifndef CREST_SOURCE_DIGEST
#define CREST_SOURCE_DIGEST "unknown"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T>
using In1D = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using In2D = nb::ndarray<const T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out1D = nb::ndarray<nb::numpy, T, nb::ndim<1>>;
using Out2D = nb::ndarray<nb::numpy, double, nb::ndim<2>>;

// An array owning `v`; with a const T, read-only (numpy's writeable flag off: what the caller must not change).
template <typename T>
Out1D<T> owned_array(std::vector<std::remove_const_t<T>>&& v) {
  using V = std::vector<std::remove_const_t<T>>;
  auto* heap = new V(std::move(v));
  heap->reserve(1);  // never a null pointer: an empty array with none would be exported as a new, writeable one
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<V*>(p); });
  return Out1D<T>(heap->data(), {heap->size()}, owner);
}

template <typename T>
Out1D<T> to_numpy(std::vector<T>&& v) {
  return owned_array<T>(std::move(v));
}

Out2D to_numpy_2d(std::vector<double>&& v, std::size_t rows, std::size_t cols) {
  auto* heap = new std::vector<double>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return Out2D(heap->data(), {rows, cols}, owner);
}

nb::tuple tree_tuple(crest::Tree&& t) {
  uint64_t root = t.root_count;
  return nb::make_tuple(to_numpy(std::move(t.tokens)), to_numpy(std::move(t.parents)), to_numpy(std::move(t.counts)),
                        root);
}

// A source tree passed as (ngram_len, token_ids uint32, parents int32, counts uint32, root_count), or a heads tree as
// (token_ids uint32, parents int32, probs float64); its arrays are held in `keep` while the step reads them.
struct Held {
  In1D<uint32_t> tokens;
  In1D<int32_t> parents;
  In1D<uint32_t> counts;
  In1D<double> probs;
};

crest::SourceTree source(nb::handle h, std::vector<Held>& keep) {
  nb::tuple t = nb::cast<nb::tuple>(h);
  keep.push_back({nb::cast<In1D<uint32_t>>(t[1]), nb::cast<In1D<int32_t>>(t[2]), nb::cast<In1D<uint32_t>>(t[3])});
  const Held& held = keep.back();
  return {nb::cast<int>(t[0]), held.tokens.data(), held.parents.data(), held.counts.data(), held.tokens.shape(0),
          nb::cast<uint64_t>(t[4])};
}

crest::SourceTree heads_tree(nb::handle h, std::vector<Held>& keep) {
  if (h.is_none()) return {};
  nb::tuple t = nb::cast<nb::tuple>(h);
  keep.push_back({nb::cast<In1D<uint32_t>>(t[0]), nb::cast<In1D<int32_t>>(t[1]), {}, nb::cast<In1D<double>>(t[2])});
  const Held& held = keep.back();
  crest::SourceTree out{0, held.tokens.data(), held.parents.data(), nullptr, held.tokens.shape(0), 0};
  out.probs = held.probs.data();
  return out;
}

std::vector<crest::SourceTree> heads_of(nb::handle heads, std::size_t rows, std::vector<Held>& keep) {
  std::vector<crest::SourceTree> out;
  if (heads.is_none()) return out;
  for (nb::handle h : nb::cast<nb::list>(heads)) out.push_back(heads_tree(h, keep));
  if (out.size() != rows) throw nb::value_error("heads must have one entry per row");
  return out;
}

std::vector<crest::Handle> handles_of(const In1D<int64_t>& a) { return {a.data(), a.data() + a.shape(0)}; }

std::vector<int> budgets_of(const In1D<int64_t>& a) { return {a.data(), a.data() + a.shape(0)}; }

// A step's drafts, flat: (tokens [nodes] int64, parents [nodes] int32, scores [nodes] float64, offsets [rows + 1]
// int64, chosen [rows] int64: the datastore candidate each row drafted from, sources [nodes] uint8: the sources whose
// trees hold each node, bit k for crest_native.SOURCES[k]).
nb::tuple drafts_tuple(std::vector<crest::Drafted>& out) {
  std::vector<int64_t> tokens, offsets{0}, chosen;
  std::vector<int32_t> parents;
  std::vector<double> scores;
  std::vector<uint8_t> sources;
  for (auto& d : out) {
    tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
    parents.insert(parents.end(), d.parents.begin(), d.parents.end());
    scores.insert(scores.end(), d.scores.begin(), d.scores.end());
    sources.insert(sources.end(), d.sources.begin(), d.sources.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
    chosen.push_back(d.chosen);
  }
  return nb::make_tuple(to_numpy(std::move(tokens)), to_numpy(std::move(parents)), to_numpy(std::move(scores)),
                        to_numpy(std::move(offsets)), to_numpy(std::move(chosen)), to_numpy(std::move(sources)));
}

// Core's options, each named once, here: its keyword (crest_native.DEFAULTS, Core's `options`) and its field of
// crest::Options, whose initializers are the defaults. Each is a whole number; `sources` (names of
// crest_native.SOURCES) is apart.
struct OptionField {
  const char* name;
  int crest::Options::*whole;          // an int field, or
  std::size_t crest::Options::*bytes;  // a byte count (>= 0)
};
constexpr OptionField kOptionFields[] = {
    {"local_depth", &crest::Options::local_depth, nullptr},
    {"match_nodes", &crest::Options::match_nodes, nullptr},
    {"outputs_bytes", nullptr, &crest::Options::outputs_bytes},
    {"outputs_depth", &crest::Options::outputs_depth, nullptr},
    {"context_tokens", &crest::Options::context_tokens, nullptr},
    {"back_off_min_budget", &crest::Options::back_off_min_budget, nullptr},
    {"max_tokens", &crest::Options::max_tokens, nullptr},
};

// Every option of `o` by its keyword (crest_native.DEFAULTS is this of the defaults).
nb::dict options_dict(const crest::Options& o) {
  nb::dict d;
  for (const OptionField& f : kOptionFields) d[f.name] = f.whole ? nb::cast(o.*(f.whole)) : nb::cast(o.*(f.bytes));
  nb::list sources;
  for (int k = 0; k < crest::kNumSources; ++k)
    if (o.sources[k]) sources.append(nb::str(crest::kSourceNames[k]));
  d["sources"] = nb::tuple(sources);
  return d;
}

void set_sources(crest::Options& o, nb::handle names) {
  for (bool& on : o.sources) on = false;
  for (nb::handle item : names) {
    std::string name = nb::cast<std::string>(item);
    int k = 0;
    while (k < crest::kNumSources && name != crest::kSourceNames[k]) ++k;
    if (k == crest::kNumSources) throw nb::value_error(("unknown source '" + name + "'; see crest_native.SOURCES").c_str());
    o.sources[k] = true;
  }
}

void set_option(crest::Options& o, const OptionField& f, nb::handle value) {
  std::string name = f.name;
  if (!nb::isinstance<nb::int_>(value) || nb::isinstance<nb::bool_>(value))
    throw nb::type_error((name + " must be an int").c_str());
  int64_t v = nb::cast<int64_t>(value);
  if (f.bytes) {
    if (v < 0) throw nb::value_error((name + " must be >= 0 (0: off)").c_str());
    o.*(f.bytes) = static_cast<std::size_t>(v);
  } else {
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      throw nb::value_error((name + " is out of an int's range").c_str());
    o.*(f.whole) = static_cast<int>(v);
  }
}

// crest::Options from `given` (keyword -> value); an option left out keeps its default. The core checks the values
// it cannot draft with (crest::Core's constructor).
crest::Options options_of(const nb::dict& given) {
  crest::Options o;
  for (auto [key, value] : given) {
    std::string name = nb::cast<std::string>(key);
    if (name == "sources") {
      set_sources(o, value);
      continue;
    }
    const OptionField* f = std::find_if(std::begin(kOptionFields), std::end(kOptionFields),
                                        [&](const OptionField& x) { return name == x.name; });
    if (f == std::end(kOptionFields))
      throw nb::value_error(("unknown Core option '" + name + "'; the options are crest_native.DEFAULTS' keys").c_str());
    set_option(o, *f, value);
  }
  return o;
}

// (followed per pair, -1) or (None, the first pair holding a new id outside [0, limit), that id): nothing followed.
template <typename T>
nb::tuple follow_rows(crest::Core& c, const In1D<int64_t>& handles, const In2D<T>& rows, const In1D<int64_t>& index,
                      const In1D<T>& lengths, int64_t limit) {
  std::vector<uint8_t> followed(handles.shape(0));
  int64_t bad = -1, bad_id = 0;
  {
    nb::gil_scoped_release quiet;
    bad = c.follow_rows<T>(handles.data(), rows.data(), rows.shape(0), rows.shape(1), index.data(), lengths.data(),
                           followed.size(), limit, followed.data(), &bad_id);
  }
  if (bad >= 0) return nb::make_tuple(nb::none(), bad, bad_id);
  return nb::make_tuple(std::vector<bool>(followed.begin(), followed.end()), -1, 0);
}

// A step-cost curve given as (tokens, seconds, tail, draft_s) (drafting.CostCurve), its arrays held while it is used.
struct HeldCurve {
  In1D<double> tokens, seconds;
  crest::StepCurve curve;
};

// `given` checked: 1..1024 points, tokens increasing, seconds >= 0, tail and draft_s finite and >= 0.
HeldCurve curve_of(nb::handle given) {
  if (!nb::isinstance<nb::tuple>(given) || nb::len(given) != 4)
    throw nb::type_error("curve must be (tokens, seconds, tail, draft_s): a drafting.CostCurve");
  In1D<double> tokens = nb::cast<In1D<double>>(given[0]), seconds = nb::cast<In1D<double>>(given[1]);
  double tail = nb::cast<double>(given[2]), jump = nb::cast<double>(given[3]);
  std::size_t m = tokens.shape(0);
  if (m < 1 || m > 1024 || seconds.shape(0) != m)
    throw nb::value_error("a step-cost curve has 1..1024 points, as many seconds as tokens");
  for (std::size_t i = 0; i < m; ++i) {
    if (!(seconds.data()[i] >= 0) || (i && !(tokens.data()[i] > tokens.data()[i - 1])))
      throw nb::value_error("a step-cost curve's tokens must increase and its seconds be >= 0");
  }
  if (!(tail >= 0) || tail == std::numeric_limits<double>::infinity())
    throw nb::value_error("a step-cost curve's tail must be finite and >= 0");
  if (!(jump >= 0) || jump == std::numeric_limits<double>::infinity())
    throw nb::value_error("a step-cost curve's draft_s must be finite and >= 0");
  const double* t = tokens.data();
  const double* s = seconds.data();
  return {std::move(tokens), std::move(seconds), {t, s, m, tail, jump}};
}

// A step's curve (None: not cut, an empty curve) for drafts that are chains (`chain`, else ValueError).
HeldCurve cost_of(nb::handle curve, bool chain) {
  if (curve.is_none()) return {};
  if (!chain) throw nb::value_error("a step-cost curve cuts chains only (chain=True)");
  return curve_of(curve);
}

// An engine's rows as a steady step reads them, checked before anything changes (the door of the one call): pair i's
// row (index[i], or i when index is None) inside the rows given, its count within the row's columns, its budget in
// 0..kMaxBudget. Throws ValueError naming the input and the fix.
template <typename T>
std::vector<int64_t> engine_index(nb::handle index, const In2D<T>& rows, const In1D<T>& lengths,
                                  const In1D<int64_t>& budgets, std::size_t pairs) {
  const std::size_t num_rows = std::min(rows.shape(0), lengths.shape(0)), width = rows.shape(1);
  std::vector<int64_t> at(pairs);
  if (index.is_none()) {
    if (pairs > num_rows)
      throw nb::value_error(("index is None (every row) but " + std::to_string(pairs) + " requests were given for " +
                             std::to_string(num_rows) + " rows; pass one request per row, or the rows' index")
                                .c_str());
    for (std::size_t i = 0; i < pairs; ++i) at[i] = static_cast<int64_t>(i);
  } else {
    auto given = nb::cast<In1D<int64_t>>(index, false);
    if (given.shape(0) != pairs) throw nb::value_error("index and handles must have one entry per pair");
    for (std::size_t i = 0; i < pairs; ++i) {
      at[i] = given.data()[i];
      if (at[i] < 0 || static_cast<std::size_t>(at[i]) >= num_rows)
        throw nb::value_error(("index[" + std::to_string(i) + "] = " + std::to_string(at[i]) + " names a row outside the " +
                               std::to_string(num_rows) + " given; pass row numbers of the engine's batch")
                                  .c_str());
    }
  }
  for (std::size_t i = 0; i < pairs; ++i) {
    const auto n = static_cast<int64_t>(lengths.data()[at[i]]);
    if (n < 0 || static_cast<std::size_t>(n) > width)
      throw nb::value_error(("lengths[" + std::to_string(at[i]) + "] = " + std::to_string(n) + " is outside 0.." +
                             std::to_string(width) + " (the rows' columns); pass each row's count of tokens")
                                .c_str());
    const int64_t b = budgets.data()[i];
    if (b < 0 || b > crest::kMaxBudget)
      throw nb::value_error(("budgets[" + std::to_string(i) + "] = " + std::to_string(b) + " is outside 0.." +
                             std::to_string(crest::kMaxBudget) + "; pass the draft tokens to verify (0: none)")
                                .c_str());
  }
  return at;
}

// A step's chains as an engine takes them: (token ids, one list of ints per row; scores [nodes] float64, read-only,
// row after row; backed off: the rows that drafted from a shorter datastore n-gram than their longest, chosen > 0).
nb::tuple chain_lists(const std::vector<crest::Drafted>& out) {
  nb::list lists;
  std::vector<double> scores;
  int64_t backed_off = 0;
  for (const auto& d : out) {
    nb::list row;
    for (int64_t t : d.tokens) row.append(nb::int_(t));
    lists.append(row);
    scores.insert(scores.end(), d.scores.begin(), d.scores.end());
    backed_off += d.chosen > 0;
  }
  return nb::make_tuple(lists, owned_array<const double>(std::move(scores)), backed_off);
}

// A steady engine step in one call: check the rows (engine_index), follow each row's new tokens (as follow_rows), then,
// when every pair followed, draft each row's chain from the replicas (as draft_stored with chain=True), cut to the
// batch's goodput-best tokens on the step-cost curve when one is given (Core::cut_to_curve). Returns (followed, bad,
// bad_id, chains, damaged): followed and bad/bad_id as follow_rows; chains None when a pair did not follow or an id was
// refused (nothing drafted), else chain_lists' tuple (every row empty when a replica was found damaged: its index in
// damaged, else -1).
template <typename T>
nb::tuple follow_draft_stored(crest::Core& c, const In1D<int64_t>& handles, const In2D<T>& rows, nb::handle index,
                              const In1D<T>& lengths, int64_t limit, const In1D<int64_t>& budgets,
                              const crest::Replica* datastore, const crest::Replica* live, double min_score,
                              nb::handle curve, const crest::Replica* delta) {
  std::size_t pairs = handles.shape(0);
  if (budgets.shape(0) != pairs) throw nb::value_error("handles and budgets must have one entry per row");
  std::vector<int64_t> at = engine_index(index, rows, lengths, budgets, pairs);
  std::vector<uint8_t> followed(pairs);
  HeldCurve cost = cost_of(curve, true);
  auto h = handles_of(handles);
  auto b = budgets_of(budgets);
  crest::StoredTrees stored(datastore, live, delta, c.retrieval_scratch());
  std::vector<crest::Drafted> out;
  int64_t bad = -1, bad_id = 0;
  bool all = false, ok = false;
  {
    nb::gil_scoped_release quiet;
    bad = c.follow_rows<T>(handles.data(), rows.data(), rows.shape(0), rows.shape(1), at.data(), lengths.data(),
                           pairs, limit, followed.data(), &bad_id);
    all = bad < 0 && std::all_of(followed.begin(), followed.end(), [](uint8_t f) { return f != 0; });
    if (all) ok = c.draft(h, b, {}, stored, true, min_score, out);
    if (ok && !curve.is_none()) c.cut_to_curve(h, cost.curve, out);
  }
  if (bad >= 0) return nb::make_tuple(nb::none(), bad, bad_id, nb::none(), -1);
  nb::object chains = nb::none();
  if (all) {
    if (!ok) {
      out.clear();
      out.resize(pairs);
    }
    chains = chain_lists(out);
  }
  return nb::make_tuple(std::vector<bool>(followed.begin(), followed.end()), -1, 0, chains, stored.damaged);
}

// Depths of a scored tree given by its parents (parents[i] in -1..i-1, checked: chain_cut and tree_cut take any tree).
std::vector<int32_t> depths_of(const In1D<int32_t>& parents, const In1D<double>& scores) {
  if (scores.shape(0) != parents.shape(0)) throw nb::value_error("parents and scores differ in length");
  std::vector<int32_t> d(parents.shape(0));
  for (std::size_t i = 0; i < d.size(); ++i) {
    int32_t p = parents.data()[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) throw nb::value_error("parents are not a tree: parents[i] in -1..i-1");
    d[i] = p < 0 ? 1 : d[p] + 1;
  }
  return d;
}

// Replica.find: the tree, None (absent), or "unreadable" / "damaged".
nb::object replica_find(const crest::Replica& r, In1D<uint32_t> tokens) {
  crest::Tree t;
  std::vector<uint8_t> record;
  switch (r.find(tokens.data(), static_cast<int>(tokens.shape(0)), t, record)) {
    case crest::Probe::kFound:
      return tree_tuple(std::move(t));
    case crest::Probe::kAbsent:
      return nb::none();
    case crest::Probe::kUnreadable:
      return nb::str("unreadable");
    case crest::Probe::kDamaged:
      break;
  }
  return nb::str("damaged");
}

// Replica.longest: (n-gram length, tree) of the longest stored suffix of `context`, None, or "damaged".
nb::object replica_longest(const crest::Replica& r, In1D<uint32_t> context) {
  std::vector<crest::Tree> trees;
  std::vector<int> lengths;
  std::vector<uint8_t> record;
  std::size_t found = 0;
  bool intact;
  {
    nb::gil_scoped_release quiet;
    intact = crest::stored_suffixes(r, context.data(), context.shape(0), false, trees, lengths, found, record);
  }
  if (!intact) return nb::str("damaged");
  if (!found) return nb::none();
  return nb::make_tuple(lengths[0], tree_tuple(std::move(trees[0])));
}

void bind_replica_reader(nb::module_& m) {
  nb::exception<crest::ReplicaError>(m, "ReplicaError", PyExc_OSError);
  nb::class_<crest::Replica>(m, "Replica")
      .def(nb::init<const std::string&>(), "path"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("find", &replica_find, "tokens"_a)
      .def("longest", &replica_longest, "context"_a)
      .def("unchanged", &crest::Replica::unchanged)
      .def_prop_ro("identity", [](const crest::Replica& r) { return nb::bytes(r.identity().data(), r.identity().size()); })
      .def_prop_ro("lengths", [](const crest::Replica& r) { return r.lengths(); })
      .def_prop_ro("key_width", &crest::Replica::key_width)
      .def_prop_ro("entries", &crest::Replica::entries)
      .def_prop_ro("unreadable", &crest::Replica::unreadable)
      .def_prop_ro("slots", &crest::Replica::slots)
      .def_prop_ro("file_size", &crest::Replica::file_size)
      .def_prop_ro("path", &crest::Replica::path)
      .def_prop_ro("inode", &crest::Replica::inode);
}

// A replica writer and the COPY bytes its pending (compressed) rows point into, until `complete` stores them.
struct Writer {
  crest::ReplicaWriter w;
  nb::bytes data;
  std::vector<crest::ReplicaWriter::Pending> pending;
  Writer(const std::string& path, int width, const std::string& identity) : w(path, width, identity) {}
};

nb::bytes bytes_of(const void* data, std::size_t size) { return nb::bytes(static_cast<const char*>(data), size); }

// ReplicaWriter.add_copy: (bytes used, the zstd rows' frames, their segments and sizes, the other rows'
// (compression id, body, payload length)); the rows stay pending until `complete`.
nb::tuple writer_add_copy(Writer& self, nb::bytes data) {
  if (!self.pending.empty()) throw nb::value_error("complete() the pending rows first");
  self.data = data;
  std::size_t used;
  crest::ReplicaWriter::ZstdFrames z;
  {
    nb::gil_scoped_release quiet;
    used = self.w.add_copy(reinterpret_cast<const uint8_t*>(data.c_str()), data.size(), self.pending);
    z = crest::ReplicaWriter::zstd_frames(self.pending);
  }
  nb::list others;
  for (const auto& p : self.pending)
    if (!p.zstd()) others.append(nb::make_tuple(crest::compression_of(p.header3[2]), bytes_of(p.body, p.body_len),
                                                p.raw_len));
  return nb::make_tuple(used, bytes_of(z.frames.data(), z.frames.size()),
                        bytes_of(z.segments.data(), z.segments.size() * 8), bytes_of(z.sizes.data(), z.sizes.size() * 8),
                        others);
}

// ReplicaWriter.complete: the payloads of the pending rows, the zstd ones from `zstd`, the others from `others`, each
// in order (a payload is a buffer, or None: it did not decompress).
void writer_complete(Writer& self, nb::handle zstd, nb::handle others) {
  std::size_t zstd_rows = 0;
  for (const auto& row : self.pending) zstd_rows += row.zstd();
  if (nb::len(zstd) != zstd_rows || nb::len(others) != self.pending.size() - zstd_rows)
    throw nb::value_error("complete() takes one payload (or None) per pending row");
  std::size_t z = 0, o = 0;
  for (const auto& row : self.pending) {
    nb::object p = row.zstd() ? zstd[z++] : others[o++];
    if (p.is_none()) {
      self.w.complete(row, nullptr, 0);
      continue;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(p.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    self.w.complete(row, static_cast<const uint8_t*>(view.buf), static_cast<std::size_t>(view.len));
    PyBuffer_Release(&view);
  }
  self.pending.clear();
  self.data = nb::bytes();
}

void bind_replica_writer(nb::module_& m) {
  nb::class_<Writer>(m, "ReplicaWriter")
      .def(nb::init<const std::string&, int, const std::string&>(), "path"_a, "key_width"_a, "identity"_a)
      .def("add_copy", &writer_add_copy, "data"_a)
      .def("complete", &writer_complete, "zstd"_a, "others"_a)
      .def("finish", [](Writer& self) { self.w.finish(); }, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("entries", [](const Writer& self) { return self.w.entries(); })
      .def_prop_ro("unreadable", [](const Writer& self) { return self.w.unreadable(); })
      .def_prop_ro("records_bytes", [](const Writer& self) { return self.w.records_bytes(); });
}

void core_init(crest::Core* self, In1D<double> coef, double intercept, double prior, const nb::dict& options,
               nb::handle token_ids, nb::handle token_bias) {
  crest::Calibration cal{std::vector<double>(coef.data(), coef.data() + coef.shape(0)), intercept, prior, {}, {}};
  if (token_ids.is_none() != token_bias.is_none())
    throw nb::value_error("pass token_ids and token_bias together (a calibration's token term), or neither");
  if (!token_ids.is_none()) {
    auto ids = nb::cast<In1D<int64_t>>(token_ids);
    auto bias = nb::cast<In1D<double>>(token_bias);
    cal.bias_tokens.assign(ids.data(), ids.data() + ids.shape(0));
    cal.token_bias.assign(bias.data(), bias.data() + bias.shape(0));
  }
  new (self) crest::Core(std::move(cal), options_of(options));
}

// Core.stop: the request's output (None: it was not active).
nb::object core_stop(crest::Core& c, int64_t h) {
  std::vector<uint32_t> output;
  if (!c.stop(h, output)) return nb::none();
  return nb::cast(to_numpy(std::move(output)));
}

int64_t core_inactive(const crest::Core& c, const In1D<int64_t>& handles) {
  int64_t n = 0;
  for (std::size_t i = 0; i < handles.shape(0); ++i) n += !c.active(handles.data()[i]);
  return n;
}

Out1D<uint32_t> core_tokens(const crest::Core& c, int64_t h, std::size_t from) {
  std::vector<uint32_t> out;
  c.tokens(h, from, out);
  return to_numpy(std::move(out));
}

// The request table: start, extend, stop and read requests.
void bind_core_requests(nb::class_<crest::Core>& core) {
  core.def("start", [](crest::Core& c, In1D<uint32_t> p) { return c.start(p.data(), p.shape(0)); }, "prompt"_a)
      .def(
          "extend", [](crest::Core& c, int64_t h, In1D<uint32_t> t) { c.extend(h, t.data(), t.shape(0)); },
          "handle"_a, "tokens"_a)
      .def("inactive", &core_inactive, "handles"_a)
      .def("stop", &core_stop, "handle"_a)
      .def(
          "add_outputs",
          [](crest::Core& c, In1D<uint32_t> tokens, In1D<int64_t> lengths) {
            c.add_outputs(tokens.data(), tokens.shape(0), lengths.data(), lengths.shape(0));
          },
          "tokens"_a, "lengths"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("active", &crest::Core::active, "handle"_a)
      .def("acceptance", &crest::Core::acceptance, "handle"_a)
      .def("count", &crest::Core::count, "handle"_a)
      .def("tokens", &core_tokens, "handle"_a, "start"_a = 0)
      .def("__len__", &crest::Core::size);
}

// Core.draft_stored: (drafts, damaged) of a step drafted from the replicas (empty drafts when one was found damaged,
// its index in damaged, else -1); with a step-cost curve (chains only), each chain cut to the batch's goodput.
nb::tuple core_draft_stored(crest::Core& c, In1D<int64_t> handles, In1D<int64_t> budgets,
                            const crest::Replica* datastore, const crest::Replica* live, nb::handle heads, bool chain,
                            double min_score, nb::handle curve, const crest::Replica* delta) {
  std::vector<Held> keep;
  keep.reserve(handles.shape(0));
  auto h = handles_of(handles);
  auto b = budgets_of(budgets);
  auto heads_trees = heads_of(heads, h.size(), keep);
  HeldCurve cost = cost_of(curve, chain);
  crest::StoredTrees stored(datastore, live, delta, c.retrieval_scratch());
  std::vector<crest::Drafted> out;
  bool ok;
  {
    nb::gil_scoped_release quiet;
    ok = c.draft(h, b, heads_trees, stored, chain, min_score, out);
    if (ok && !curve.is_none()) c.cut_to_curve(h, cost.curve, out);
  }
  if (!ok) out.clear();
  nb::tuple drafts = drafts_tuple(out);
  return nb::make_tuple(drafts, stored.damaged);
}

// The trees a caller looked up, per row: its datastore candidates (a list) and its live layer's trees, the main build's
// and the delta's (each a tree or None; `delta` None: no delta for any row).
crest::GivenTrees given_trees(nb::list stored, nb::list live, nb::handle delta, std::vector<Held>& keep) {
  std::size_t rows = stored.size(), trees = 3 * rows;
  for (nb::handle s : stored) trees += nb::len(s);
  keep.reserve(trees);  // the borrowed arrays stay put
  crest::GivenTrees given;
  given.rows.resize(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    for (nb::handle t : nb::cast<nb::list>(stored[i])) given.rows[i].candidates.push_back(source(t, keep));
    if (!live[i].is_none()) given.rows[i].live = source(live[i], keep);
    if (!delta.is_none() && !delta[i].is_none()) given.rows[i].delta = source(delta[i], keep);
  }
  return given;
}

// Core.draft_given: the drafts of a step from the trees the caller looked up (the round trip).
nb::tuple core_draft_given(crest::Core& c, In1D<int64_t> handles, In1D<int64_t> budgets, nb::list stored,
                           nb::list live, nb::handle heads, bool chain, double min_score, nb::handle curve,
                           nb::handle delta) {
  std::size_t rows = handles.shape(0);
  if (budgets.shape(0) != rows || stored.size() != rows || live.size() != rows ||
      (!delta.is_none() && nb::len(delta) != rows))
    throw nb::value_error("handles, budgets, stored, live and delta must have one entry per row");
  std::vector<Held> keep;
  crest::GivenTrees given = given_trees(stored, live, delta, keep);
  auto h = handles_of(handles);
  auto b = budgets_of(budgets);
  auto heads_trees = heads_of(heads, rows, keep);
  HeldCurve cost = cost_of(curve, chain);
  std::vector<crest::Drafted> out;
  {
    nb::gil_scoped_release quiet;
    c.draft(h, b, heads_trees, given, chain, min_score, out);
    if (!curve.is_none()) c.cut_to_curve(h, cost.curve, out);
  }
  return drafts_tuple(out);
}

// Core.plan: (back_off per row, each row's context tail to look up) of a round-trip step.
nb::tuple core_plan(const crest::Core& c, In1D<int64_t> handles, In1D<int64_t> budgets, bool chain, std::size_t tail,
                    uint64_t limit) {
  std::vector<uint8_t> back_off;
  std::vector<std::vector<uint32_t>> tails;
  c.plan(handles_of(handles), budgets_of(budgets), chain, tail, limit, back_off, tails);
  nb::list out;
  for (auto& t : tails) {
    nb::list ids;
    for (uint32_t v : t) ids.append(v);
    out.append(ids);
  }
  return nb::make_tuple(to_numpy(std::move(back_off)), out);
}

// Core.tables: the merged node table of each candidate, (tokens, parents, depths, features [N, F], scores).
nb::list core_tables(crest::Core& c, int64_t h, nb::list stored, nb::handle live, nb::handle heads, nb::handle delta) {
  std::vector<Held> keep;
  keep.reserve(nb::len(stored) + 3);
  crest::Retrieved given;
  for (nb::handle t : stored) given.candidates.push_back(source(t, keep));
  if (!live.is_none()) given.live = source(live, keep);
  if (!delta.is_none()) given.delta = source(delta, keep);
  crest::SourceTree heads_view = heads_tree(heads, keep);
  std::vector<crest::NodeTable> tables;
  c.tables(h, given, heads_view, tables);
  nb::list out;
  for (auto& t : tables) {
    std::size_t n = t.shape.size();
    out.append(nb::make_tuple(to_numpy(std::move(t.shape.tokens)), to_numpy(std::move(t.shape.parents)),
                              to_numpy(std::move(t.shape.depths)),
                              to_numpy_2d(std::move(t.features), n, crest::kNumFeatures), to_numpy(std::move(t.scores))));
  }
  return out;
}

nb::dict core_outputs_info(const crest::Core& c) {
  const auto& o = c.outputs();
  nb::dict d;
  d["outputs"] = o.num_outputs();
  d["bytes"] = o.nbytes();
  d["allocated"] = o.allocated();
  d["max_bytes"] = o.max_bytes();
  d["evictions"] = o.evictions;
  return d;
}

// The step: follow an engine's rows, draft (from the replicas, or from trees the caller looked up), plan, score.
void bind_core_steps(nb::class_<crest::Core>& core) {
  core.def("follow_rows", &follow_rows<int32_t>, "handles"_a, "rows"_a, "index"_a, "lengths"_a, "limit"_a)
      .def("follow_rows", &follow_rows<int64_t>, "handles"_a, "rows"_a, "index"_a, "lengths"_a, "limit"_a)
      .def("follow_draft_stored", &follow_draft_stored<int32_t>, "handles"_a.noconvert(), "rows"_a.noconvert(),
           "index"_a.none(), "lengths"_a.noconvert(), "limit"_a, "budgets"_a.noconvert(), "datastore"_a.none(), "live"_a.none(), "min_score"_a, "curve"_a.none() = nb::none(),
           "delta"_a.none() = nb::none())
      .def("follow_draft_stored", &follow_draft_stored<int64_t>, "handles"_a.noconvert(), "rows"_a.noconvert(),
           "index"_a.none(), "lengths"_a.noconvert(), "limit"_a, "budgets"_a.noconvert(), "datastore"_a.none(), "live"_a.none(), "min_score"_a, "curve"_a.none() = nb::none(),
           "delta"_a.none() = nb::none())
      .def("draft_stored", &core_draft_stored, "handles"_a, "budgets"_a, "datastore"_a.none(), "live"_a.none(),
           "heads"_a.none(), "chain"_a, "min_score"_a, "curve"_a.none() = nb::none(),
           "delta"_a.none() = nb::none())
      .def("draft_given", &core_draft_given, "handles"_a, "budgets"_a, "stored"_a, "live"_a, "heads"_a.none(),
           "chain"_a, "min_score"_a, "curve"_a.none() = nb::none(), "delta"_a.none() = nb::none())
      .def("plan", &core_plan, "handles"_a, "budgets"_a, "chain"_a, "tail"_a, "limit"_a)
      .def("tables", &core_tables, "handle"_a, "stored"_a, "live"_a.none(), "heads"_a.none(),
           "delta"_a.none() = nb::none())
      .def("outputs_info", &core_outputs_info);
}

void bind_core(nb::module_& m) {
  m.attr("DEFAULTS") = options_dict(crest::Options());
  nb::class_<crest::Core> core(m, "Core");
  core.def("__init__", &core_init, "coef"_a, "intercept"_a, "prior"_a, "options"_a = nb::dict(),
           "token_ids"_a.none() = nb::none(), "token_bias"_a.none() = nb::none());
  bind_core_requests(core);
  bind_core_steps(core);
}

void bind_constants(nb::module_& m) {
  nb::list features, sources;
  for (const auto& name : crest::feature_names()) features.append(nb::str(name.c_str()));
  for (const char* name : crest::kSourceNames) sources.append(nb::str(name));
  m.attr("FEATURES") = nb::tuple(features);
  m.attr("SOURCES") = nb::tuple(sources);
  m.attr("SOURCE_DIGEST") = CREST_SOURCE_DIGEST;
  m.attr("MAX_BUDGET") = crest::kMaxBudget;
  m.attr("REPLICA_VERSION") = crest::kReplicaVersion;
  nb::dict compression;
  compression["none"] = static_cast<int>(crest::kCompressionNone);
  compression["zstd"] = static_cast<int>(crest::kCompressionZstd);
  compression["lz4"] = static_cast<int>(crest::kCompressionLz4);
  m.attr("COMPRESSION_IDS") = compression;
}

nb::tuple parse_blob(nb::bytes blob, nb::bytes payload) {
  const auto* b = reinterpret_cast<const uint8_t*>(blob.c_str());
  crest::BlobHeader h = crest::parse_blob_header(b, blob.size());
  crest::Tree t;
  crest::parse_checked(b, h, reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), t);
  return tree_tuple(std::move(t));
}

nb::tuple parse_tree_payload(nb::bytes payload, int width) {
  crest::Tree t;
  crest::parse_payload(reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), width, t);
  return tree_tuple(std::move(t));
}

// The codec of a stored tree (datastore.codec): blob header, checked parse, payload parse, key hash.
void bind_codec(nb::module_& m) {
  m.def(
      "blob_header",
      [](nb::bytes blob) {
        crest::BlobHeader h = crest::parse_blob_header(reinterpret_cast<const uint8_t*>(blob.c_str()), blob.size());
        return nb::make_tuple(h.compression, h.raw_len, h.body);
      },
      "blob"_a);
  m.def("parse_blob", &parse_blob, "blob"_a, "payload"_a);
  m.def("parse_tree_payload", &parse_tree_payload, "payload"_a, "width"_a);
  m.def(
      "key_hash", [](nb::bytes key) { return crest::key_hash(reinterpret_cast<const uint8_t*>(key.c_str()), key.size()); },
      "key"_a);
}

Out1D<uint8_t> goodput_keep(In1D<double> scores, int64_t rows, nb::handle curve) {
  if (rows < 1) throw nb::value_error("rows must be >= 1");
  HeldCurve cost = curve_of(curve);
  std::vector<uint8_t> keep;
  std::vector<int32_t> order;
  crest::goodput_keep(scores.data(), scores.shape(0), rows, cost.curve, keep, order);
  return to_numpy(std::move(keep));
}

Out1D<int64_t> chain_cut(In1D<int32_t> parents, In1D<double> scores, int max_len, double min_score) {
  std::vector<int32_t> depths = depths_of(parents, scores);
  if (max_len < 0) throw nb::value_error("max_len must be >= 0");
  crest::CutScratch z;
  std::vector<int32_t> path;
  crest::chain_cut({parents.data(), depths.data(), scores.data(), parents.shape(0)}, max_len, min_score, z, path);
  return to_numpy(std::vector<int64_t>(path.begin(), path.end()));
}

nb::tuple tree_cut(In1D<int32_t> parents, In1D<double> scores, int budget, double min_score) {
  std::vector<int32_t> depths = depths_of(parents, scores);
  if (budget < 0) throw nb::value_error("budget must be >= 0");
  crest::CutScratch z;
  std::vector<int32_t> order, renumbered;
  crest::tree_cut({parents.data(), depths.data(), scores.data(), parents.shape(0)}, budget, min_score, z, order,
                  renumbered);
  return nb::make_tuple(to_numpy(std::vector<int64_t>(order.begin(), order.end())), to_numpy(std::move(renumbered)));
}

// The cuts a caller checks drafts with (the oracle tests): goodput, chain and tree cuts.
void bind_cuts(nb::module_& m) {
  m.def("goodput_keep", &goodput_keep, "scores"_a, "rows"_a, "curve"_a);
  m.def("chain_cut", &chain_cut, "parents"_a, "scores"_a, "max_len"_a, "min_score"_a);
  m.def("tree_cut", &tree_cut, "parents"_a, "scores"_a, "budget"_a, "min_score"_a);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The native drafting core of crest-spec (see crest_native, drafting.DraftingService, datastore.replica).";
  // Replicas are held by daemon threads until exit; nanobind would report them as leaks on
  // a clean shutdown, which is not a fault (a clean run prints no warnings).
  nb::set_leak_warnings(false);
  bind_constants(m);
  bind_codec(m);
  bind_cuts(m);
  bind_replica_reader(m);
  bind_replica_writer(m);
  bind_core(m);
}
