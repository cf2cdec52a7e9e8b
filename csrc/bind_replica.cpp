// Python bindings of the replicas' reader and writer, the codec of a stored tree, the cuts a caller checks drafts
// with (the oracle tests) and the module's constants (csrc/bindings.hpp).
#include "bindings.hpp"

#ifndef CREST_SOURCE_DIGEST
#define CREST_SOURCE_DIGEST "unknown"
#endif

namespace crest_bind {

using namespace nb::literals;

// -- replicas: the reader and the writer ---------------------------------------------------------------------------

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

void bind_replicas(nb::module_& m) {
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
  nb::class_<Writer>(m, "ReplicaWriter")
      .def(nb::init<const std::string&, int, const std::string&>(), "path"_a, "key_width"_a, "identity"_a)
      .def("add_copy", &writer_add_copy, "data"_a)
      .def("complete", &writer_complete, "zstd"_a, "others"_a)
      .def("finish", [](Writer& self) { self.w.finish(); }, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("entries", [](const Writer& self) { return self.w.entries(); })
      .def_prop_ro("unreadable", [](const Writer& self) { return self.w.unreadable(); })
      .def_prop_ro("records_bytes", [](const Writer& self) { return self.w.records_bytes(); });
}

// -- the codec of a stored tree, and the cuts a caller checks drafts with (the oracle tests) -------------------------

// Depths of a scored tree given by its parents (parents[i] in -1..i-1, checked: the cuts take any tree).
crest::Scored scored(const In1D<int32_t>& parents, const In1D<double>& scores, std::vector<int32_t>& depths) {
  if (scores.shape(0) != parents.shape(0)) throw nb::value_error("parents and scores differ in length");
  depths.resize(parents.shape(0));
  for (std::size_t i = 0; i < depths.size(); ++i) {
    const int32_t p = parents.data()[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) throw nb::value_error("parents are not a tree: parents[i] in -1..i-1");
    depths[i] = p < 0 ? 1 : depths[p] + 1;
  }
  return {parents.data(), depths.data(), scores.data(), parents.shape(0)};
}

void bind_functions(nb::module_& m) {
  m.def("blob_header", [](nb::bytes blob) {
    crest::BlobHeader h = crest::parse_blob_header(reinterpret_cast<const uint8_t*>(blob.c_str()), blob.size());
    return nb::make_tuple(h.compression, h.raw_len, h.body);
  }, "blob"_a);
  m.def("parse_blob", [](nb::bytes blob, nb::bytes payload) {
    const auto* b = reinterpret_cast<const uint8_t*>(blob.c_str());
    crest::BlobHeader h = crest::parse_blob_header(b, blob.size());
    crest::Tree t;
    crest::parse_checked(b, h, reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), t);
    return tree_tuple(std::move(t));
  }, "blob"_a, "payload"_a);
  m.def("parse_tree_payload", [](nb::bytes payload, int width) {
    crest::Tree t;
    crest::parse_payload(reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), width, t);
    return tree_tuple(std::move(t));
  }, "payload"_a, "width"_a);
  m.def("key_hash", [](nb::bytes key) {
    return crest::key_hash(reinterpret_cast<const uint8_t*>(key.c_str()), key.size());
  }, "key"_a);
  m.def("goodput_keep", [](In1D<double> scores, int64_t rows, const Curve& curve) {
    if (rows < 1) throw nb::value_error("rows must be >= 1");
    std::vector<uint8_t> keep;
    std::vector<int32_t> order;
    crest::goodput_keep(scores.data(), scores.shape(0), rows, curve.view(), keep, order);
    return owned(std::move(keep));
  }, "scores"_a, "rows"_a, "curve"_a);
  m.def("chain_cut", [](In1D<int32_t> parents, In1D<double> scores, int max_len, double min_score) {
    if (max_len < 0) throw nb::value_error("max_len must be >= 0");
    std::vector<int32_t> depths, path;
    crest::CutScratch z;
    crest::chain_cut(scored(parents, scores, depths), max_len, min_score, z, path);
    return owned(std::vector<int64_t>(path.begin(), path.end()));
  }, "parents"_a, "scores"_a, "max_len"_a, "min_score"_a);
  m.def("tree_cut", [](In1D<int32_t> parents, In1D<double> scores, int budget, double min_score) {
    if (budget < 0) throw nb::value_error("budget must be >= 0");
    std::vector<int32_t> depths, order, renumbered;
    crest::CutScratch z;
    crest::tree_cut(scored(parents, scores, depths), budget, min_score, z, order, renumbered);
    return nb::make_tuple(owned(std::vector<int64_t>(order.begin(), order.end())), owned(std::move(renumbered)));
  }, "parents"_a, "scores"_a, "budget"_a, "min_score"_a);
}

void bind_constants(nb::module_& m) {
  nb::list features, sources;
  for (const auto& name : crest::feature_names()) features.append(nb::str(name.c_str()));
  for (const char* name : crest::kSourceNames) sources.append(nb::str(name));
  m.attr("FEATURES") = nb::tuple(features);
  nb::list model;
  for (const char* name : crest::kModelFeatureNames) model.append(nb::str(name));
  m.attr("MODEL_FEATURES") = nb::tuple(model);
  m.attr("SOURCES") = nb::tuple(sources);
  m.attr("SOURCE_DIGEST") = CREST_SOURCE_DIGEST;
  m.attr("MAX_BUDGET") = crest::kMaxBudget;
  m.attr("START") = crest::kStart;
  m.attr("REPLICA_VERSION") = crest::kReplicaVersion;
  nb::dict compression;
  compression["none"] = static_cast<int>(crest::kCompressionNone);
  compression["zstd"] = static_cast<int>(crest::kCompressionZstd);
  compression["lz4"] = static_cast<int>(crest::kCompressionLz4);
  m.attr("COMPRESSION_IDS") = compression;
}

}  // namespace crest_bind
