// Python bindings of a step's input value types (crest_native.Curve, EngineRows, Trees), each checked when it is made
// (csrc/bindings.hpp; the step itself is bound in csrc/module.cpp).
#include "bindings.hpp"

namespace crest_bind {

using namespace nb::literals;

void curve_init(Curve* self, In1D<double> tokens, In1D<double> seconds, double tail, double draft_s) {
  const std::size_t m = tokens.shape(0);
  if (m < 1 || m > 1024 || seconds.shape(0) != m)
    throw nb::value_error("a step-cost curve has 1..1024 points, as many seconds as tokens");
  for (std::size_t i = 0; i < m; ++i)
    if (!(seconds.data()[i] >= 0) || (i && !(tokens.data()[i] > tokens.data()[i - 1])))
      throw nb::value_error("a step-cost curve's tokens must increase and its seconds be >= 0");
  if (!(tail >= 0 && std::isfinite(tail)) || !(draft_s >= 0 && std::isfinite(draft_s)))
    throw nb::value_error("a step-cost curve's tail and draft_s must be finite and >= 0");
  new (self) Curve{tokens, seconds, tail, draft_s};
}

using AnyRows = nb::ndarray<nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using AnyCounts = nb::ndarray<nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void rows_init(Rows* self, nb::handle ids, nb::handle lengths, nb::handle index, int64_t limit) {
  AnyRows r;
  AnyCounts n;
  if (!nb::try_cast(ids, r, false) || (r.dtype() != nb::dtype<int32_t>() && r.dtype() != nb::dtype<int64_t>()))
    throw nb::type_error("rows must be the engine's [rows, max_len] int32 or int64 token array (C order, not copied)");
  if (!nb::try_cast(lengths, n, false) || n.dtype() != r.dtype())
    throw nb::type_error("lengths must be a 1-D array of the rows' dtype: each row's count of tokens");
  In1D<int64_t> at;
  if (!index.is_none() && !nb::try_cast(index, at, false))
    throw nb::type_error("index must be a 1-D int64 array (each pair's row) or None (pair i on row i)");
  if (limit < 1 || limit > (int64_t{1} << 32)) throw nb::value_error("vocab_size must be in 1..2**32");
  new (self) Rows{r, n, nb::borrow(index), limit};
}

void trees_init(Trees* self, nb::list stored, nb::list live, nb::list delta) {
  new (self) Trees();
  const std::size_t rows = stored.size();
  if (live.size() != rows || delta.size() != rows) throw nb::value_error("pass one entry per row in each list");
  self->given.rows.resize(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    crest::Retrieved& row = self->given.rows[i];
    for (nb::handle t : nb::cast<nb::list>(stored[i])) row.candidates.push_back(self->tree(t));
    if (!live[i].is_none()) row.live = self->tree(live[i]);
    if (!delta[i].is_none()) row.delta = self->tree(delta[i]);
  }
}

void bind_inputs(nb::module_& m) {
  nb::class_<Curve>(m, "Curve")
      .def("__init__", &curve_init, "tokens"_a, "seconds"_a, "tail"_a, "draft_s"_a = 0.0)
      .def_ro("tokens", &Curve::tokens).def_ro("seconds", &Curve::seconds)
      .def_ro("tail", &Curve::tail).def_ro("draft_s", &Curve::draft_s);
  nb::class_<Rows>(m, "EngineRows")
      .def("__init__", &rows_init, "rows"_a, "lengths"_a, "index"_a.none() = nb::none(), "limit"_a = int64_t{1} << 31)
      .def_ro("rows", &Rows::ids).def_ro("lengths", &Rows::lengths).def_ro("index", &Rows::index)
      .def_ro("limit", &Rows::limit);
  nb::class_<Trees>(m, "Trees").def("__init__", &trees_init, "stored"_a, "live"_a, "delta"_a);
}

}  // namespace crest_bind
