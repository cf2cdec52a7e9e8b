// Python bindings of the native drafting core (nanobind), the module crest_native._core: the core's options, a
// step's batch and its typed result, and the core itself (csrc/bindings.hpp; a step's input value types are bound in
// csrc/bind_inputs.cpp; the replicas, the codec and the cuts in csrc/bind_replica.cpp).
#include "bindings.hpp"

namespace crest_bind {

using namespace nb::literals;

// -- the core's settings: crest::Options, each field by its own name ------------------------------------------------

#define CREST_OPTIONS(X)                                                                                         \
  X(local_depth) X(match_nodes) X(outputs_bytes) X(outputs_depth) X(context_tokens) X(back_off_min_budget) X(max_tokens) \
  X(online_strength) X(online_memory) X(online_refit) X(online_share)

void bind_options(nb::module_& m) {
  nb::class_<crest::Options> c(m, "Options");
  c.def(nb::init<>());
  nb::list names;
#define CREST_BIND(name) c.def_rw(#name, &crest::Options::name), names.append(#name);
  CREST_OPTIONS(CREST_BIND)
#undef CREST_BIND
  names.append("sources");
  c.def_prop_rw(
      "sources",
      [](const crest::Options& o) {
        nb::list out;
        for (int k = 0; k < crest::kNumSources; ++k)
          if (o.sources[k]) out.append(crest::kSourceNames[k]);
        return nb::tuple(out);
      },
      [](crest::Options& o, const std::vector<std::string>& given) {
        bool on[crest::kNumSources] = {};
        for (const std::string& name : given) {
          int k = 0;
          while (k < crest::kNumSources && name != crest::kSourceNames[k]) ++k;
          if (k == crest::kNumSources) throw nb::value_error(("unknown source '" + name + "'; see SOURCES").c_str());
          on[k] = true;
        }
        std::copy(on, on + crest::kNumSources, o.sources);
      });
  c.attr("names") = nb::tuple(names);
}

// -- a step's inputs -----------------------------------------------------------------------------------------------


// One step's arguments (Core.step): the requests and their budgets, the form and the cut, and what each follows.
struct Batch {
  In1D<int64_t> handles, budgets;
  bool chain = false;
  double min_score = 0.0;
  // a Curve, Rows, [N] uint32 with [pairs] int64 counts, [pairs, d] float32 with [pairs] bool, or None
  nb::object curve = nb::none(), rows = nb::none(), appended = nb::none(), counts = nb::none(), states = nb::none(),
             has_state = nb::none();
  uint64_t key_limit = uint64_t{1} << 32;
};

// -- the step's result ---------------------------------------------------------------------------------------------

struct Step {
  nb::object followed = nb::none();  // list[bool], or None: pair `bad` held new id `bad_id` (nothing followed)
  int64_t bad = -1, bad_id = 0, inactive = 0, backed_off = 0, nodes = 0;
  bool drafted = false;
  int damaged = -1;
  std::vector<crest::Drafted> drafts;  // the drafts (drafted); each array below is made from them when first read
  nb::object arrays[6] = {nb::none(), nb::none(), nb::none(), nb::none(), nb::none(), nb::none()};
  nb::object back_off = nb::none(), tails = nb::none(), counts = nb::none(), sets = nb::none();  // the plan, else None
  std::vector<int64_t> engine_handles;  // an engine step's handles, and the outputs of the requests it stopped
  std::vector<std::vector<uint32_t>> engine_outputs;
  nb::object handles_array = nb::none();  // engine_handles, once read
  int64_t resynced = 0;

  nb::object handles() {  // [pairs] int64, read only (None: not an engine step)
    if (handles_array.is_none() && !engine_handles.empty())
      handles_array = nb::cast(owned(std::vector<int64_t>(engine_handles)));
    return handles_array;
  }
  nb::list outputs() {  // the stopped requests' outputs, each [n] uint32, in the order of the stops
    nb::list out;
    for (auto& o : engine_outputs) out.append(nb::cast(owned(std::vector<uint32_t>(o))));
    return out;
  }

  template <class T, std::vector<T> crest::Drafted::*field>
  nb::object flat(int k) {  // the drafts' `field`s end to end (None when nothing was drafted)
    if (!drafted || !arrays[k].is_none()) return arrays[k];
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(nodes));
    for (const auto& d : drafts) out.insert(out.end(), (d.*field).begin(), (d.*field).end());
    return arrays[k] = nb::cast(owned(std::move(out)));
  }
  nb::object per_draft(int k, bool offsets) {  // [rows + 1] offsets of each draft's nodes, or [rows] chosen candidates
    if (!drafted || !arrays[k].is_none()) return arrays[k];
    std::vector<int64_t> out;
    if (offsets) out.push_back(0);
    for (const auto& d : drafts) out.push_back(offsets ? out.back() + static_cast<int64_t>(d.tokens.size()) : d.chosen);
    return arrays[k] = nb::cast(owned(std::move(out)));
  }
  nb::list token_lists() const {  // each row's draft tokens as a list of ints (what an engine takes)
    nb::list out;
    for (const auto& d : drafts) out.append(nb::cast(d.tokens));
    return out;
  }
};

namespace {

crest::EngineRows engine_rows(const Rows& r, std::size_t pairs) {
  crest::EngineRows rows{r.ids.data(), r.lengths.data(), r.ids.dtype() == nb::dtype<int64_t>(),
                         std::min(r.ids.shape(0), r.lengths.shape(0)), r.ids.shape(1), nullptr, r.limit};
  if (!r.index.is_none()) {
    auto index = nb::cast<In1D<int64_t>>(r.index);
    if (index.shape(0) != pairs) throw nb::value_error("pass one row of index per request");
    rows.index = index.data();
  }
  return rows;
}

// states [pairs, d] float32 and has_state [pairs] bool (both None: none), read in place (drafting.door checked them).
void read_states(const crest::Core& core, nb::handle states_obj, nb::handle has_obj, std::size_t pairs,
                 const float** states, const uint8_t** has_state) {
  if (states_obj.is_none()) return;
  auto st = nb::cast<In2D<float>>(states_obj, false);
  auto has = nb::cast<In1D<bool>>(has_obj, false);
  if (st.shape(0) != pairs || st.shape(1) != core.model_width() || has.shape(0) != st.shape(0))
    throw nb::value_error("pass one state of the model's width per request, and has_state per request");
  *states = st.data(), *has_state = reinterpret_cast<const uint8_t*>(has.data());
}

// A step's retrieval from its `source`: the replicas of each datastore set (StoreSets), the Trees a round trip looked
// up, or None (plan what a round trip must fetch).
crest::Retrieval* retrieval_of(crest::Core& core, nb::handle source, crest::StoredTrees& stored) {
  if (source.is_none()) return nullptr;
  if (nb::isinstance<Trees>(source)) return &nb::cast<Trees&>(source).given;
  const StoreSets& sets = nb::cast<const StoreSets&>(source);
  stored = crest::StoredTrees(sets.sets.data(), sets.sets.size(), core.retrieval_scratch());
  return &stored;
}

Step step_result(crest::StepOutput& out) {
  Step s;
  s.bad = out.bad, s.bad_id = out.bad_id, s.drafted = out.drafted, s.damaged = out.damaged, s.inactive = out.inactive;
  s.resynced = out.resynced;
  s.followed = out.bad >= 0 && out.handles.empty() ? nb::none()
                                                   : nb::cast(std::vector<bool>(out.followed.begin(), out.followed.end()));
  if (out.drafted) {
    for (const auto& d : out.drafts) s.nodes += static_cast<int64_t>(d.tokens.size()), s.backed_off += d.chosen > 0;
    s.drafts = std::move(out.drafts);
  }
  if (out.planned) {
    nb::list tails;
    for (auto& t : out.tails) tails.append(nb::cast(t));
    s.tails = tails, s.back_off = nb::cast(owned(std::move(out.back_off)));
    s.counts = nb::cast(owned(std::move(out.counts)));
    s.sets = nb::cast(owned(std::move(out.sets)));
  }
  s.engine_handles = std::move(out.handles);
  s.engine_outputs = std::move(out.outputs);
  return s;
}

}  // namespace

// Core.step: a step of a Batch (request handles, and what each follows: token lists, an engine's rows, or nothing),
// drafted from `source` (retrieval_of).
Step core_step(crest::Core& core, const Batch& b, nb::handle source) {
  crest::StepInput in;
  in.handles.assign(b.handles.data(), b.handles.data() + b.handles.shape(0));
  in.budgets.assign(b.budgets.data(), b.budgets.data() + b.budgets.shape(0));
  in.chain = b.chain;
  in.min_score = b.min_score;
  in.key_limit = b.key_limit;
  crest::StepCurve curve{};
  if (!b.curve.is_none()) curve = nb::cast<const Curve&>(b.curve).view(), in.curve = &curve;
  crest::EngineRows rows;
  if (!b.rows.is_none()) {
    rows = engine_rows(nb::cast<const Rows&>(b.rows), in.handles.size());
    in.rows = &rows;
  } else if (!b.counts.is_none()) {
    auto counts = nb::cast<In1D<int64_t>>(b.counts);
    if (counts.shape(0) != in.handles.size()) throw nb::value_error("pass one count of new tokens per request");
    in.appended = nb::cast<In1D<uint32_t>>(b.appended).data(), in.counts = counts.data();
  }
  read_states(core, b.states, b.has_state, in.handles.size(), &in.states, &in.has_state);
  crest::StoredTrees stored(nullptr, 0, nullptr);
  crest::Retrieval* retrieval = retrieval_of(core, source, stored);
  crest::StepOutput out;
  {
    nb::gil_scoped_release quiet;
    core.step(in, retrieval, out);
  }
  return step_result(out);
}

// Core.engine_step: an engine's step by request id (crest::EngineInput), drafted from `source` (retrieval_of).
Step core_engine_step(crest::Core& core, In1D<int64_t> handles, In1D<int32_t> sets, In1D<int64_t> stops,
                      const Rows& rows, In1D<int64_t> budgets, bool chain, double min_score, nb::handle curve_obj,
                      uint64_t key_limit, nb::handle states, nb::handle has_state, nb::handle source) {
  crest::EngineInput in;
  const std::size_t pairs = handles.shape(0);
  in.handles.assign(handles.data(), handles.data() + pairs);
  if (sets.shape(0) != pairs && sets.shape(0) != 0)
    throw nb::value_error("pass one datastore set per request (sets), or none where no request starts");
  in.sets = sets.shape(0) ? sets.data() : nullptr;
  in.stops.assign(stops.data(), stops.data() + stops.shape(0));
  in.rows = engine_rows(rows, pairs);
  in.budgets.assign(budgets.data(), budgets.data() + budgets.shape(0));
  in.chain = chain, in.min_score = min_score, in.key_limit = key_limit;
  crest::StepCurve curve{};
  if (!curve_obj.is_none()) curve = nb::cast<const Curve&>(curve_obj).view(), in.curve = &curve;
  read_states(core, states, has_state, pairs, &in.states, &in.has_state);
  crest::StoredTrees stored(nullptr, 0, nullptr);
  crest::Retrieval* retrieval = retrieval_of(core, source, stored);
  crest::StepOutput out;
  {
    nb::gil_scoped_release quiet;
    core.engine_step(in, retrieval, out);
  }
  return step_result(out);
}

// -- the core ------------------------------------------------------------------------------------------------------

struct NodeTable {  // one candidate's merged node table (what fitting the calibration reads)
  nb::object tokens, parents, depths, features, scores;
};

struct OutputsInfo {  // the output index: outputs held, its size model, what it holds allocated, its bound, evictions
  std::size_t outputs, bytes, allocated, max_bytes;
  int64_t evictions;
};

// A calibration: its weights, intercept and prior, and its token term (token_ids with token_bias, or neither).
crest::Calibration calibration_of(In1D<double> coef, double intercept, double prior, nb::object ids, nb::object bias) {
  crest::Calibration cal{std::vector<double>(coef.data(), coef.data() + coef.shape(0)), intercept, prior, {}, {}};
  if (ids.is_none() != bias.is_none())
    throw nb::value_error("pass token_ids and token_bias together (a calibration's token term), or neither");
  if (!ids.is_none()) {
    auto i = nb::cast<In1D<int64_t>>(ids);
    auto b = nb::cast<In1D<double>>(bias);
    cal.bias_tokens.assign(i.data(), i.data() + i.shape(0)), cal.token_bias.assign(b.data(), b.data() + b.shape(0));
  }
  return cal;
}

std::vector<NodeTable> core_tables(crest::Core& c, int64_t handle, Trees& trees, nb::object state) {
  if (trees.given.rows.size() != 1) throw nb::value_error("tables reads the trees of one request: one row");
  const float* at = nullptr;
  if (!state.is_none()) {
    auto s = nb::cast<In1D<float>>(state, false);
    if (s.shape(0) != c.model_width()) throw nb::value_error("pass a state of the model's width");
    at = s.data();
  }
  std::vector<crest::NodeTable> tables;
  c.tables(handle, trees.given.rows[0], tables, at);
  const std::size_t width = crest::kNumFeatures + (at ? crest::kNumModelFeatures : 0);
  std::vector<NodeTable> out;
  for (auto& t : tables) {
    const std::size_t n = t.shape.size();
    auto* heap = new std::vector<double>(std::move(t.features));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
    nb::ndarray<nb::numpy, double, nb::ndim<2>> features(heap->data(), {n, width}, owner);
    out.push_back({nb::cast(owned(std::move(t.shape.tokens))), nb::cast(owned(std::move(t.shape.parents))),
                   nb::cast(owned(std::move(t.shape.depths))), nb::cast(features), nb::cast(owned(std::move(t.scores)))});
  }
  return out;
}

// The step's value types: its inputs (a curve, an engine's rows, trees, the batch) and results.
void bind_step_types(nb::module_& m) {
  nb::class_<Batch>(m, "Batch")
      .def(nb::init<>())
      .def_rw("handles", &Batch::handles).def_rw("budgets", &Batch::budgets).def_rw("chain", &Batch::chain)
      .def_rw("min_score", &Batch::min_score).def_rw("key_limit", &Batch::key_limit)
      .def_rw("curve", &Batch::curve, nb::for_setter(nb::arg("value").none()))
      .def_rw("rows", &Batch::rows, nb::for_setter(nb::arg("value").none()))
      .def_rw("appended", &Batch::appended, nb::for_setter(nb::arg("value").none()))
      .def_rw("counts", &Batch::counts, nb::for_setter(nb::arg("value").none()))
      .def_rw("states", &Batch::states, nb::for_setter(nb::arg("value").none()))
      .def_rw("has_state", &Batch::has_state, nb::for_setter(nb::arg("value").none()));
  nb::class_<Step>(m, "Step")
      .def_ro("followed", &Step::followed).def_ro("bad", &Step::bad).def_ro("bad_id", &Step::bad_id)
      .def_ro("drafted", &Step::drafted).def_ro("damaged", &Step::damaged).def_ro("inactive", &Step::inactive)
      .def_ro("backed_off", &Step::backed_off).def_ro("nodes", &Step::nodes)
      .def_prop_ro("tokens", [](Step& s) { return s.flat<int64_t, &crest::Drafted::tokens>(0); })
      .def_prop_ro("parents", [](Step& s) { return s.flat<int32_t, &crest::Drafted::parents>(1); })
      .def_prop_ro("scores", [](Step& s) { return s.flat<double, &crest::Drafted::scores>(2); })
      .def_prop_ro("sources", [](Step& s) { return s.flat<uint8_t, &crest::Drafted::sources>(3); })
      .def_prop_ro("offsets", [](Step& s) { return s.per_draft(4, true); })
      .def_prop_ro("chosen", [](Step& s) { return s.per_draft(5, false); })
      .def_ro("back_off", &Step::back_off).def_ro("tails", &Step::tails).def_ro("counts", &Step::counts)
      .def_ro("sets", &Step::sets).def_prop_ro("handles", &Step::handles).def_prop_ro("outputs", &Step::outputs)
      .def_ro("resynced", &Step::resynced).def("token_lists", &Step::token_lists);
  nb::class_<NodeTable>(m, "NodeTable")
      .def_ro("tokens", &NodeTable::tokens).def_ro("parents", &NodeTable::parents)
      .def_ro("depths", &NodeTable::depths).def_ro("features", &NodeTable::features)
      .def_ro("scores", &NodeTable::scores);
  nb::class_<OutputsInfo>(m, "OutputsInfo")
      .def_ro("outputs", &OutputsInfo::outputs).def_ro("bytes", &OutputsInfo::bytes)
      .def_ro("allocated", &OutputsInfo::allocated).def_ro("max_bytes", &OutputsInfo::max_bytes)
      .def_ro("evictions", &OutputsInfo::evictions);
}

void bind_core(nb::module_& m) {
  nb::class_<crest::Core>(m, "Core")
      .def("__init__",
           [](crest::Core* self, In1D<double> coef, double intercept, double prior, const crest::Options& options,
              nb::object ids, nb::object bias) {
             new (self) crest::Core(calibration_of(coef, intercept, prior, ids, bias), options);
           }, "coef"_a, "intercept"_a, "prior"_a, "options"_a, "token_ids"_a.none() = nb::none(),
           "token_bias"_a.none() = nb::none())
      .def("start",
           [](crest::Core& c, In1D<uint32_t> p, int32_t set) {
             if (set < 0) throw nb::value_error("set must be a datastore set (>= 0)");
             return c.start(p.data(), p.shape(0), set);
           }, "prompt"_a, "set"_a = 0)
      .def("set_of", &crest::Core::set_of, "handle"_a)
      .def("fit",  // a datastore set's calibration now: (coef, intercept, outcomes it learnt from)
           [](crest::Core& c, int32_t set, bool with_model) {
             if (set < 0) throw nb::value_error("set must be a datastore set (>= 0)");
             const crest::Calibration& cal = c.calibration_of(set, with_model);
             return nb::make_tuple(owned(std::vector<double>(cal.coef)), cal.intercept, c.outcomes_of(set, with_model));
           }, "set"_a, "with_model"_a = false)
      .def("fold",  // the set's outcomes since its last fold into the fleet's learner; the new state (bytes)
           [](crest::Core& c, int32_t set, bool with_model, nb::object fleet) {
             if (set < 0) throw nb::value_error("set must be a datastore set (>= 0)");
             std::string got;
             if (fleet.is_none()) {
               got = c.fold(set, with_model, nullptr);
             } else {
               const std::string given(nb::cast<nb::bytes>(fleet).c_str(), nb::len(fleet));
               got = c.fold(set, with_model, &given);
             }
             return nb::bytes(got.data(), got.size());
           }, "set"_a, "with_model"_a, "fleet"_a.none())
      .def("forget", &crest::Core::forget, "set"_a)
      .def("unshared", &crest::Core::unshared_of, "set"_a, "with_model"_a = false)
      .def("stop",
           [](crest::Core& c, int64_t h) -> nb::object {
             std::vector<uint32_t> output;
             return c.stop(h, output) ? nb::cast(owned(std::move(output))) : nb::none();
           }, "handle"_a)
      .def("add_outputs",
           [](crest::Core& c, In1D<uint32_t> tokens, In1D<int64_t> lengths) {
             c.add_outputs(tokens.data(), tokens.shape(0), lengths.data(), lengths.shape(0));
           }, "tokens"_a, "lengths"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("step", &core_step, "batch"_a, "source"_a.none())
      .def("engine_step", &core_engine_step, "handles"_a, "sets"_a, "stops"_a, "rows"_a, "budgets"_a, "chain"_a,
           "min_score"_a, "curve"_a.none(), "key_limit"_a, "states"_a.none(), "has_state"_a.none(), "source"_a.none())
      .def("tables", &core_tables, "handle"_a, "trees"_a, "state"_a.none() = nb::none())
      .def("set_model",  // the LM head is kept alive with the core, read in place
           [](crest::Core& c, In2D<float> lm_head, In1D<double> coef, double intercept, double prior, nb::object ids,
              nb::object bias, const HeadHandle* head) {
             c.set_model(calibration_of(coef, intercept, prior, ids, bias),
                         {lm_head.data(), lm_head.shape(0), lm_head.shape(1)}, head ? head->head : nullptr);
           }, "lm_head"_a.noconvert(), "coef"_a, "intercept"_a, "prior"_a, "token_ids"_a.none() = nb::none(),
           "token_bias"_a.none() = nb::none(), "head"_a.none() = nb::none(), nb::keep_alive<1, 2>(),
           nb::keep_alive<1, 8>())
      .def_prop_ro("model_width", &crest::Core::model_width)
      .def("active", &crest::Core::active, "handle"_a)
      .def("acceptance", &crest::Core::acceptance, "handle"_a)
      .def("count", &crest::Core::count, "handle"_a)
      .def("tokens",
           [](const crest::Core& c, int64_t h, std::size_t from) {
             std::vector<uint32_t> out;
             c.tokens(h, from, out);
             return owned(std::move(out));
           }, "handle"_a, "start"_a = 0)
      .def("outputs_info",
           [](const crest::Core& c) {
             const auto& o = c.outputs();
             return OutputsInfo{o.num_outputs(), o.nbytes(), o.allocated(), o.max_bytes(), o.evictions};
           })
      .def("__len__", &crest::Core::size);
}


}  // namespace crest_bind

NB_MODULE(_core, m) {
  using namespace crest_bind;
  m.doc() = "The native drafting core of crest-spec (see crest_native, drafting.DraftingService, datastore.replica).";
  // Replicas are held by daemon threads until exit; nanobind would report them as leaks on
  // a clean shutdown, which is not a fault (a clean run prints no warnings).
  nb::set_leak_warnings(false);
  bind_constants(m);
  bind_functions(m);
  bind_options(m);
  bind_inputs(m);
  bind_step_types(m);
  bind_core(m);
  bind_replicas(m);
}
