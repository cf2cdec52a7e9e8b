// Python bindings of a step's input value types (crest_native.Curve, EngineRows, Trees) and of the draft head a core
// reads states through (crest_native.Head), each checked when it is made (csrc/bindings.hpp; the step itself is bound
// in csrc/module.cpp).
#include "bindings.hpp"

namespace crest_bind {

using namespace nb::literals;

void curve_init(Curve* self, In1D<double> tokens, In1D<double> seconds, double tail, double draft_s) {
  const std::size_t m = tokens.shape(0);
  if (m < 1 || m > 1024 || seconds.shape(0) != m)
    throw nb::value_error("a step-cost curve has 1..1024 points, as many seconds as tokens");
  for (std::size_t i = 0; i < m; ++i)
    if (!std::isfinite(tokens.data()[i]) || !std::isfinite(seconds.data()[i]) || !(seconds.data()[i] >= 0) ||
        (i && !(tokens.data()[i] > tokens.data()[i - 1])))
      throw nb::value_error(("a step-cost curve's tokens must be finite and increase, and its seconds be finite and "
                             ">= 0 (point " + std::to_string(i) + ")").c_str());
  if (!(tail >= 0 && std::isfinite(tail)) || !(draft_s >= 0 && std::isfinite(draft_s)))
    throw nb::value_error("a step-cost curve's tail and draft_s must be finite and >= 0");
  new (self) Curve{tokens, seconds, tail, draft_s};
}

void rows_init(Rows* self, nb::handle ids, nb::handle lengths, nb::handle index, nb::handle vocab) {
  Rows::Ids r;
  Rows::Counts n;
  if (!nb::try_cast(ids, r, false) || (r.dtype() != nb::dtype<int32_t>() && r.dtype() != nb::dtype<int64_t>()))
    throw nb::type_error("rows must be the engine's [rows, max_len] int32 or int64 token array (C order, not copied)");
  if (!nb::try_cast(lengths, n, false) || n.dtype() != r.dtype())
    throw nb::type_error("lengths must be a 1-D array of the rows' dtype: each row's count of tokens");
  In1D<int64_t> at;
  if (!index.is_none() && !nb::try_cast(index, at, false))
    throw nb::type_error("index must be a 1-D int64 array (each pair's row) or None (pair i on row i)");
  int64_t limit = 0;
  if (PyBool_Check(vocab.ptr()) || !PyLong_Check(vocab.ptr()))
    throw nb::type_error(("limit=" + nb::cast<std::string>(nb::repr(vocab)) + " is a " +
                          nb::cast<std::string>(vocab.type().attr("__name__")) +
                          "; pass the engine model's vocabulary size, an int in 1..2**32").c_str());
  if (!nb::try_cast(vocab, limit, false) || limit < 1 || limit > (int64_t{1} << 32))
    throw nb::value_error("vocab_size must be in 1..2**32");
  new (self) Rows{r, n, nb::borrow(index), limit};
}

void trees_init(Trees* self, nb::list stored, nb::list live, nb::list delta, nb::handle counts) {
  const std::size_t rows = stored.size();
  if (live.size() != rows || delta.size() != rows) throw nb::value_error("pass one entry per row in each list");
  In1D<uint64_t> planned;
  if (!counts.is_none() && (!nb::try_cast(counts, planned, false) || planned.shape(0) != rows))
    throw nb::type_error("counts must be the plan's counts (Step.counts: [rows] uint64) or None");
  new (self) Trees();
  if (!counts.is_none()) self->given.planned.assign(planned.data(), planned.data() + rows);
  self->given.rows.resize(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    crest::Retrieved& row = self->given.rows[i];
    for (nb::handle t : nb::cast<nb::list>(stored[i])) row.candidates.push_back(self->tree(t));
    if (!live[i].is_none()) row.live = self->tree(live[i]);
    if (!delta[i].is_none()) row.delta = self->tree(delta[i]);
  }
}

void store_sets_init(StoreSets* self, nb::list sets) {
  new (self) StoreSets();
  for (nb::handle set : sets) {
    nb::tuple t;
    if (!nb::try_cast(set, t) || t.size() != crest::kStoreKinds)
      throw nb::type_error("each datastore set is a (datastore, datastore, live, delta) tuple of Replica or None");
    crest::StoreSet out;
    for (int k = 0; k < crest::kStoreKinds; ++k)
      out.stores[k] = t[k].is_none() ? nullptr : nb::cast<const crest::Replica*>(t[k]);
    self->sets.push_back(out);
    self->held.append(t);
  }
}

void head_init(HeadHandle* self, In2D<float> up, In1D<float> up_bias, In2D<float> down, In1D<float> down_bias,
               In1D<float> state_gain, In1D<float> token_gain, nb::handle embedding) {
  In2D<float> e;
  if (!nb::try_cast(embedding, e, false))
    throw nb::type_error("embedding must be the target's [vocab, d] float32 token embedding (C order, not copied)");
  auto h = std::make_shared<crest::Head>();
  h->d = down.shape(1), h->hidden = down.shape(0);
  if (up.shape(0) != 2 * h->d || up.shape(1) != h->hidden)
    throw nb::value_error("the head's up is [2d, hidden] and its down [hidden, d]: retrain the head");
  const auto copy = [](const auto& a) { return std::vector<float>(a.data(), a.data() + a.size()); };
  h->up_bias = copy(up_bias), h->down_bias = copy(down_bias);
  h->state_gain = copy(state_gain), h->token_gain = copy(token_gain);
  if (e.shape(1) != h->d) throw nb::value_error("the embedding's width differs from the head's: train a head for this model");
  h->embedding = e.data(), h->vocab = e.shape(0);
  h->pack(up.data(), down.data());  // half-precision panels: the float32 arrays are not kept
  new (self) HeadHandle{std::move(h), nb::borrow(embedding)};
}

nb::ndarray<nb::numpy, float, nb::ndim<2>> head_estimates(const HeadHandle& self, In2D<float> states,
                                                           In1D<uint32_t> tokens) {
  const crest::Head& h = *self.head;
  const std::size_t n = states.shape(0);
  if (states.shape(1) != h.d || tokens.shape(0) != n)
    throw nb::value_error("pass states [n, d] of the head's width and one bonus token per state");
  for (std::size_t i = 0; i < n; ++i)
    if (tokens.data()[i] >= h.vocab) throw nb::value_error("a bonus token is outside the embedding's vocabulary");
  auto* out = new std::vector<float>(n * h.d);
  std::vector<float> scratch;
  h.forward(states.data(), tokens.data(), n, out->data(), scratch);
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return {out->data(), {n, h.d}, owner};
}

void bind_inputs(nb::module_& m) {
  nb::class_<HeadHandle>(m, "Head")
      .def("__init__", &head_init, "up"_a, "up_bias"_a, "down"_a, "down_bias"_a, "state_gain"_a, "token_gain"_a,
           "embedding"_a)
      .def("estimates", &head_estimates, "states"_a.noconvert(), "tokens"_a.noconvert())  // float32, uint32: no copy
      .def_prop_ro("width", [](const HeadHandle& h) { return h.head->d; })
      .def_prop_ro("hidden", [](const HeadHandle& h) { return h.head->hidden; })
      .def_prop_ro_static("avx2", [](nb::handle) { return crest::head_uses_avx2(); });
  nb::class_<Curve>(m, "Curve")
      .def("__init__", &curve_init, "tokens"_a, "seconds"_a, "tail"_a, "draft_s"_a = 0.0)
      .def_ro("tokens", &Curve::tokens).def_ro("seconds", &Curve::seconds)
      .def_ro("tail", &Curve::tail).def_ro("draft_s", &Curve::draft_s);
  nb::class_<Rows>(m, "EngineRows")
      .def("__init__", &rows_init, "rows"_a, "lengths"_a, "index"_a.none() = nb::none(),
           "limit"_a = nb::int_(int64_t{1} << 31))
      .def_ro("rows", &Rows::ids).def_ro("lengths", &Rows::lengths).def_ro("index", &Rows::index)
      .def_ro("limit", &Rows::limit);
  nb::class_<StoreSets>(m, "StoreSets")
      .def("__init__", &store_sets_init, "sets"_a)
      .def("__len__", [](const StoreSets& s) { return s.sets.size(); })
      .def("__getitem__", [](const StoreSets& s, std::size_t i) {
        if (i >= s.sets.size()) throw nb::index_error();
        return s.held[i];
      });
  nb::class_<Trees>(m, "Trees").def("__init__", &trees_init, "stored"_a, "live"_a, "delta"_a,
                                    "counts"_a.none() = nb::none());
}

}  // namespace crest_bind
