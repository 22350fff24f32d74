#include "src/plan/spec_json.h"

#include <fstream>
#include <limits>
#include <string_view>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/json.h"
#include "src/common/status.h"

namespace reshard::plan {
namespace {

using json::QuoteForMessage;
using json::Value;

// Builds "line L, column C: tensor "w": field: message".
class Context {
 public:
  explicit Context(std::string tensor = "") : tensor_(std::move(tensor)) {}
  absl::Status Error(const Value& at, const std::string& field, const std::string& message) const {
    std::string prefix = at.Where() + ": ";
    if (!tensor_.empty()) absl::StrAppend(&prefix, "tensor ", QuoteForMessage(tensor_), ": ");
    return absl::InvalidArgumentError(absl::StrCat(prefix, field, " ", message));
  }
  void set_tensor(std::string name) { tensor_ = std::move(name); }

 private:
  std::string tensor_;
};

std::string JoinKeys(std::initializer_list<std::string_view> keys) {
  std::string out;
  for (std::string_view k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

absl::Status CheckKeys(const Context& ctx, const Value& obj, const std::string& field,
                       std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : obj.members()) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || key == a;
    if (!ok) {
      return ctx.Error(value, field.empty() ? std::string("spec") : field,
                       absl::StrCat("has unknown key ", QuoteForMessage(key),
                                    " (allowed: ", JoinKeys(allowed), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Expect(const Context& ctx, const Value& v, const std::string& field,
                    Value::Type type) {
  if (v.type() != type) {
    return ctx.Error(
        v, field,
        absl::StrCat("must be ", Value::TypeName(type), ", not ", Value::TypeName(v.type())));
  }
  return absl::OkStatus();
}

absl::StatusOr<const Value*> Require(const Context& ctx, const Value& obj, const std::string& key,
                                     const std::string& field) {
  const Value* v = obj.Find(key);
  if (v == nullptr)
    return ctx.Error(obj, field, absl::StrCat("is missing \"", std::string(key), "\""));
  return v;
}

absl::StatusOr<int64_t> Integer(const Context& ctx, const Value& v, const std::string& field) {
  if (!v.is_integer()) return ctx.Error(v, field, "must be an integer");
  return v.as_int();
}

absl::StatusOr<std::vector<int64_t>> IntegerList(const Context& ctx, const Value& v,
                                                 const std::string& field) {
  RESHARD_RETURN_IF_ERROR(Expect(ctx, v, field, Value::Type::kArray));
  std::vector<int64_t> out;
  out.reserve(v.items().size());
  for (size_t i = 0; i < v.items().size(); ++i) {
    const Value& item = v.items()[i];
    // The element's name is formatted only for an error: a spec has millions of elements.
    if (!item.is_integer()) return Integer(ctx, item, absl::StrFormat("%s[%d]", field, i)).status();
    out.push_back(item.as_int());
  }
  return out;
}

// Appends rank `v` at nesting depth `depth` to `mesh`; `field()` names it in an error (formatted
// only then: a whole model's spec names tens of millions of ranks).
template <typename FieldName>
absl::Status AddRank(const Context& ctx, const Value& v, const FieldName& field, size_t depth,
                     Mesh& mesh) {
  if (depth != mesh.shape.size()) {
    return ctx.Error(v, field(), "is ragged: ranks appear at different nesting depths");
  }
  if (v.as_int() < 0 || v.as_int() > INT32_MAX) {
    return ctx.Error(v, field(), absl::StrCat("rank ", v.as_int(), " is not a valid rank"));
  }
  if (mesh.ranks.size() >= static_cast<size_t>(kMaxWorldSize)) {
    return ctx.Error(
        v, field(),
        absl::StrFormat("is one rank more than %d, the limit of a world", kMaxWorldSize));
  }
  mesh.ranks.push_back(static_cast<int32_t>(v.as_int()));
  return absl::OkStatus();
}

// Nested list of ranks -> mesh shape and row-major ranks. Ragged lists are errors.
absl::Status ParseMeshLevel(const Context& ctx, const Value& v, const std::string& field,
                            size_t depth, Mesh& mesh) {
  if (v.is_integer()) return AddRank(ctx, v, [&field] { return field; }, depth, mesh);
  if (!v.is_array()) return ctx.Error(v, field, "must contain only arrays and integer ranks");
  if (v.items().empty()) return ctx.Error(v, field, "has an empty axis");
  if (depth == mesh.shape.size()) {
    if (!mesh.ranks.empty()) {
      return ctx.Error(v, field, "is ragged: ranks appear at different nesting depths");
    }
    if (depth >= static_cast<size_t>(kMaxMeshDims)) {
      return ctx.Error(v, field, absl::StrFormat("has more than %d axes", kMaxMeshDims));
    }
    mesh.shape.push_back(static_cast<int64_t>(v.items().size()));
  } else if (mesh.shape[depth] != static_cast<int64_t>(v.items().size())) {
    return ctx.Error(v, field,
                     absl::StrFormat("is ragged: axis %d has %d entries here and %d elsewhere",
                                     depth, v.items().size(), mesh.shape[depth]));
  }
  for (size_t i = 0; i < v.items().size(); ++i) {
    const Value& item = v.items()[i];
    auto item_field = [&field, i] { return absl::StrFormat("%s[%d]", field, i); };
    if (item.is_integer()) {
      RESHARD_RETURN_IF_ERROR(AddRank(ctx, item, item_field, depth + 1, mesh));
    } else {
      RESHARD_RETURN_IF_ERROR(ParseMeshLevel(ctx, item, item_field(), depth + 1, mesh));
    }
  }
  return absl::OkStatus();
}

// Digits only, 1 to `max_digits` of them: no sign, no spaces, no leading '+'.
bool ParseDigits(std::string_view text, size_t max_digits, int64_t& out) {
  if (text.empty() || text.size() > max_digits || max_digits > 19) return false;
  uint64_t value = 0;  // At most 19 digits: below 10^19 < 2^64.
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  out = static_cast<int64_t>(value);
  return true;
}

// "R", "S(d)" or "_S(d, k)": torch's str() of Replicate(), Shard(d) and _StridedShard(d,
// split_factor=k); "_S(d,k)" too (no space), as torch's own comments write it. _S(d, 1) is S(d).
absl::StatusOr<Placement> ParsePlacement(const Context& ctx, const Value& v,
                                         const std::string& field) {
  RESHARD_RETURN_IF_ERROR(Expect(ctx, v, field, Value::Type::kString));
  const std::string& s = v.as_string();
  if (s == "R") return Placement::Replicate();
  const std::string_view text(s);
  int64_t dim = 0;
  if (text.starts_with("S(") && text.ends_with(')') &&
      ParseDigits(text.substr(2, text.size() - 3), 3, dim)) {
    return Placement::Shard(static_cast<int>(dim));
  }
  if (text.starts_with("_S(") && text.ends_with(')')) {
    const std::string_view inner = text.substr(3, text.size() - 4);
    const size_t comma = inner.find(',');
    int64_t split = 0;
    if (comma != std::string_view::npos) {
      std::string_view k = inner.substr(comma + 1);
      if (k.starts_with(' ')) k.remove_prefix(1);
      if (ParseDigits(inner.substr(0, comma), 3, dim)) {
        // 19 digits hold every int64_t below 10^19; larger ones are no split factor either.
        if (ParseDigits(k, 19, split)) return Placement::StridedShard(static_cast<int>(dim), split);
        if (!k.empty() && k.size() <= 40 && k.find_first_not_of("0123456789") == k.npos) {
          return ctx.Error(v, field,
                           absl::StrCat("is ", QuoteForMessage(s),
                                        "; a split factor is at least 1 and below 2^62"));
        }
      }
    }
  }
  return ctx.Error(v, field,
                   absl::StrCat("is ", QuoteForMessage(s),
                                "; a placement is \"R\", \"S(d)\" or \"_S(d, k)\""));
}

absl::Status ParseView(const Context& ctx, const Value& v, const std::string& field,
                       size_t tensor_ndim, View& view) {
  RESHARD_RETURN_IF_ERROR(Expect(ctx, v, field, Value::Type::kObject));
  RESHARD_RETURN_IF_ERROR(CheckKeys(ctx, v, field, {"offset", "strides"}));
  if (const Value* offset = v.Find("offset")) {
    RESHARD_ASSIGN_OR_RETURN(view.offset, Integer(ctx, *offset, field + ".offset"));
  }
  if (const Value* strides = v.Find("strides")) {
    RESHARD_ASSIGN_OR_RETURN(view.strides, IntegerList(ctx, *strides, field + ".strides"));
    // In a spec, empty strides mean row-major; written out they are a mistake (a scalar's
    // strides are [] and fine).
    if (view.strides.empty() && tensor_ndim > 0) {
      return ctx.Error(*strides, field + ".strides",
                       absl::StrFormat("has 0 entries for a %d-D tensor (omit strides for "
                                       "row-major)",
                                       tensor_ndim));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseLayout(const Context& ctx, const Value& v, const std::string& side,
                         size_t tensor_ndim, Layout& layout) {
  RESHARD_RETURN_IF_ERROR(Expect(ctx, v, side, Value::Type::kObject));
  RESHARD_RETURN_IF_ERROR(CheckKeys(ctx, v, side,
                                    {"mesh", "placements", "buffer", "view", "dtype", "quant",
                                     "scale_buffer", "scale_view"}));
  RESHARD_ASSIGN_OR_RETURN(const Value* mesh, Require(ctx, v, "mesh", side));
  RESHARD_RETURN_IF_ERROR(Expect(ctx, *mesh, side + ".mesh", Value::Type::kArray));
  RESHARD_RETURN_IF_ERROR(ParseMeshLevel(ctx, *mesh, side + ".mesh", 0, layout.mesh));
  RESHARD_ASSIGN_OR_RETURN(const Value* placements, Require(ctx, v, "placements", side));
  RESHARD_RETURN_IF_ERROR(Expect(ctx, *placements, side + ".placements", Value::Type::kArray));
  for (size_t i = 0; i < placements->items().size(); ++i) {
    RESHARD_ASSIGN_OR_RETURN(
        Placement p,
        ParsePlacement(ctx, placements->items()[i], absl::StrFormat("%s.placements[%d]", side, i)));
    layout.placements.push_back(p);
  }
  if (const Value* buffer = v.Find("buffer")) {
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *buffer, side + ".buffer", Value::Type::kString));
    if (buffer->as_string().empty()) return ctx.Error(*buffer, side + ".buffer", "is empty");
    layout.buffer = buffer->as_string();
  }
  if (const Value* view = v.Find("view")) {
    RESHARD_RETURN_IF_ERROR(ParseView(ctx, *view, side + ".view", tensor_ndim, layout.view));
    layout.has_view = true;
  }
  if (const Value* dtype = v.Find("dtype")) {
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *dtype, side + ".dtype", Value::Type::kString));
    auto parsed = ParseDType(dtype->as_string());
    if (!parsed) {
      return ctx.Error(*dtype, side + ".dtype",
                       absl::StrCat(QuoteForMessage(dtype->as_string()),
                                    " is unknown (known: ", std::string(DTypeNames()), ")"));
    }
    layout.dtype = *parsed;
  }
  if (const Value* quant = v.Find("quant")) {
    const std::string field = side + ".quant";
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *quant, field, Value::Type::kObject));
    RESHARD_RETURN_IF_ERROR(CheckKeys(ctx, *quant, field, {"scheme", "block"}));
    RESHARD_ASSIGN_OR_RETURN(const Value* scheme, Require(ctx, *quant, "scheme", field));
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *scheme, field + ".scheme", Value::Type::kString));
    const std::string& name = scheme->as_string();
    if (name == "block") {
      layout.quant.scheme = QuantScheme::kBlock;
    } else if (name == "mx") {
      layout.quant.scheme = QuantScheme::kMx;
    } else if (name == "channel") {
      layout.quant.scheme = QuantScheme::kChannel;
    } else if (name == "tensor") {
      layout.quant.scheme = QuantScheme::kTensor;
    } else {
      return ctx.Error(*scheme, field + ".scheme",
                       absl::StrCat(QuoteForMessage(name),
                                    " is unknown (known: block, mx, channel, tensor)"));
    }
    if (const Value* block = quant->Find("block")) {
      RESHARD_ASSIGN_OR_RETURN(layout.quant.block, IntegerList(ctx, *block, field + ".block"));
      if (layout.quant.block.empty()) return ctx.Error(*block, field + ".block", "is empty");
    }
  }
  if (const Value* buffer = v.Find("scale_buffer")) {
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *buffer, side + ".scale_buffer", Value::Type::kString));
    if (buffer->as_string().empty()) return ctx.Error(*buffer, side + ".scale_buffer", "is empty");
    layout.scale_buffer = buffer->as_string();
  }
  if (const Value* view = v.Find("scale_view")) {
    RESHARD_RETURN_IF_ERROR(
        ParseView(ctx, *view, side + ".scale_view", tensor_ndim, layout.scale_view));
    layout.has_scale_view = true;
  }
  return absl::OkStatus();
}

absl::Status ParseTopology(const Context& ctx, const Value& v, Topology& topo) {
  RESHARD_RETURN_IF_ERROR(Expect(ctx, v, "topology", Value::Type::kObject));
  RESHARD_RETURN_IF_ERROR(CheckKeys(
      ctx, v, "topology",
      {"domains", "ranks_per_domain", "nic_gbytes_per_s", "nvlink_gbytes_per_s", "gpus_per_node"}));
  if (const Value* domains = v.Find("domains")) {
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *domains, "topology.domains", Value::Type::kArray));
    for (size_t i = 0; i < domains->items().size(); ++i) {
      const std::string field = absl::StrFormat("topology.domains[%d]", i);
      RESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> ranks,
                               IntegerList(ctx, domains->items()[i], field));
      std::vector<int32_t> domain;
      for (int64_t r : ranks) {
        if (r < 0 || r > INT32_MAX) {
          return ctx.Error(domains->items()[i], field, absl::StrCat("rank ", r, " is not valid"));
        }
        domain.push_back(static_cast<int32_t>(r));
      }
      topo.domains.push_back(std::move(domain));
    }
  }
  if (const Value* n = v.Find("ranks_per_domain")) {
    RESHARD_ASSIGN_OR_RETURN(topo.ranks_per_domain, Integer(ctx, *n, "topology.ranks_per_domain"));
    if (topo.ranks_per_domain < 1)
      return ctx.Error(*n, "topology.ranks_per_domain", "must be >= 1");
  }
  if (const Value* n = v.Find("gpus_per_node")) {
    RESHARD_ASSIGN_OR_RETURN(topo.gpus_per_node, Integer(ctx, *n, "topology.gpus_per_node"));
    if (topo.gpus_per_node < 1) return ctx.Error(*n, "topology.gpus_per_node", "must be >= 1");
  }
  for (auto [key, out] : {std::pair{"nic_gbytes_per_s", &topo.nic_gbytes_per_s},
                          std::pair{"nvlink_gbytes_per_s", &topo.nvlink_gbytes_per_s}}) {
    if (const Value* bw = v.Find(key)) {
      const std::string field = absl::StrCat("topology.", key);
      if (!bw->is_number() || !(bw->as_double() > 0)) {
        return ctx.Error(*bw, field, "must be a positive number");
      }
      if (!BandwidthInRange(bw->as_double())) {
        return ctx.Error(*bw, field, BandwidthRangeError(bw->as_double()));
      }
      *out = bw->as_double();
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTensor(const Value& v, size_t index, TensorSpec& t) {
  Context ctx;
  const std::string field = absl::StrFormat("tensors[%d]", index);
  RESHARD_RETURN_IF_ERROR(Expect(ctx, v, field, Value::Type::kObject));
  RESHARD_ASSIGN_OR_RETURN(const Value* name, Require(ctx, v, "name", field));
  RESHARD_RETURN_IF_ERROR(Expect(ctx, *name, field + ".name", Value::Type::kString));
  if (name->as_string().empty()) return ctx.Error(*name, field + ".name", "is empty");
  t.name = name->as_string();
  ctx.set_tensor(t.name);
  RESHARD_RETURN_IF_ERROR(CheckKeys(ctx, v, "tensor", {"name", "dtype", "shape", "src", "dst"}));
  RESHARD_ASSIGN_OR_RETURN(const Value* dtype, Require(ctx, v, "dtype", "tensor"));
  RESHARD_RETURN_IF_ERROR(Expect(ctx, *dtype, "dtype", Value::Type::kString));
  auto parsed = ParseDType(dtype->as_string());
  if (!parsed) {
    return ctx.Error(*dtype, "dtype",
                     absl::StrCat(QuoteForMessage(dtype->as_string()),
                                  " is unknown (known: ", std::string(DTypeNames()), ")"));
  }
  t.dtype = *parsed;
  RESHARD_ASSIGN_OR_RETURN(const Value* shape, Require(ctx, v, "shape", "tensor"));
  RESHARD_ASSIGN_OR_RETURN(t.shape, IntegerList(ctx, *shape, "shape"));
  RESHARD_ASSIGN_OR_RETURN(const Value* src, Require(ctx, v, "src", "tensor"));
  RESHARD_RETURN_IF_ERROR(ParseLayout(ctx, *src, "src", t.shape.size(), t.src));
  RESHARD_ASSIGN_OR_RETURN(const Value* dst, Require(ctx, v, "dst", "tensor"));
  RESHARD_RETURN_IF_ERROR(ParseLayout(ctx, *dst, "dst", t.shape.size(), t.dst));
  return absl::OkStatus();
}

// The spec a parsed document holds, unvalidated. Takes the document and frees it on return: a
// whole model's spec parses into tens of millions of values, which validation need not share
// memory with.
absl::StatusOr<RefitSpec> ConvertSpecJson(Value doc) {
  Context ctx;
  RESHARD_RETURN_IF_ERROR(Expect(ctx, doc, "spec", Value::Type::kObject));
  RESHARD_RETURN_IF_ERROR(CheckKeys(ctx, doc, "", {"comment", "topology", "tensors"}));
  RefitSpec spec;
  if (const Value* comment = doc.Find("comment")) {
    RESHARD_RETURN_IF_ERROR(Expect(ctx, *comment, "comment", Value::Type::kString));
    spec.comment = comment->as_string();
  }
  if (const Value* topo = doc.Find("topology")) {
    RESHARD_RETURN_IF_ERROR(ParseTopology(ctx, *topo, spec.topology));
  }
  RESHARD_ASSIGN_OR_RETURN(const Value* tensors, Require(ctx, doc, "tensors", "spec"));
  RESHARD_RETURN_IF_ERROR(Expect(ctx, *tensors, "tensors", Value::Type::kArray));
  if (tensors->items().size() > kMaxTensors) {
    return ctx.Error(*tensors, "tensors",
                     absl::StrFormat("has %d entries; at most %d are allowed",
                                     tensors->items().size(), kMaxTensors));
  }
  spec.tensors.resize(tensors->items().size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    RESHARD_RETURN_IF_ERROR(ParseTensor(tensors->items()[i], i, spec.tensors[i]));
  }
  return spec;
}

}  // namespace

namespace {

// The validated spec of a parsed document (ParseSpecJson's second half).
absl::StatusOr<RefitSpec> SpecFromDocument(Value doc) {
  RESHARD_ASSIGN_OR_RETURN(RefitSpec spec, ConvertSpecJson(std::move(doc)));
  RESHARD_RETURN_IF_ERROR(Validate(spec));
  return spec;
}

}  // namespace

absl::StatusOr<RefitSpec> ParseSpecJson(std::string_view text) {
  RESHARD_ASSIGN_OR_RETURN(Value doc, json::Parse(text));
  return SpecFromDocument(std::move(doc));
}

absl::StatusOr<RefitSpec> LoadSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the spec file"));
  // Read once into one string (a stringstream's str() would copy a whole model's spec again).
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) text.append(chunk, in.gcount());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": reading the spec file failed"));
  // As ParseSpecJson, with the text freed once parsed: text and document together, then
  // document and spec together, are the peaks of loading a whole model's spec.
  absl::StatusOr<Value> doc = json::Parse(text);
  std::string().swap(text);
  absl::StatusOr<RefitSpec> spec =
      doc.ok() ? SpecFromDocument(*std::move(doc)) : absl::StatusOr<RefitSpec>(doc.status());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

namespace {

void AppendMesh(std::string& out, const Mesh& mesh, size_t axis, int64_t& next) {
  if (axis == mesh.shape.size()) {
    absl::StrAppend(&out, mesh.ranks[next++]);
    return;
  }
  out += '[';
  for (int64_t i = 0; i < mesh.shape[axis]; ++i) {
    if (i) out += ", ";
    AppendMesh(out, mesh, axis + 1, next);
  }
  out += ']';
}

void AppendView(std::string& out, const char* key, const View& v) {
  absl::StrAppend(&out, ", \"", key, "\": {\"offset\": ", v.offset);
  if (!v.strides.empty()) {
    absl::StrAppend(&out, ", \"strides\": [", absl::StrJoin(v.strides, ", "), "]");
  }
  out += '}';
}

void AppendLayout(std::string& out, const Layout& l) {
  out += "{\"mesh\": ";
  int64_t next = 0;
  AppendMesh(out, l.mesh, 0, next);
  out += ", \"placements\": [";
  for (size_t i = 0; i < l.placements.size(); ++i) {
    if (i) out += ", ";
    out += json::Quote(l.placements[i].ToString());
  }
  out += ']';
  if (!l.buffer.empty()) absl::StrAppend(&out, ", \"buffer\": ", json::Quote(l.buffer));
  if (l.has_view || !l.view.strides.empty() || l.view.offset != 0) {
    AppendView(out, "view", l.view);
  }
  if (l.dtype) absl::StrAppend(&out, ", \"dtype\": \"", std::string(DTypeName(*l.dtype)), "\"");
  if (l.quant.scheme != QuantScheme::kNone) {
    absl::StrAppend(&out, ", \"quant\": {\"scheme\": \"", QuantSchemeName(l.quant.scheme), "\"");
    if (!l.quant.block.empty()) {
      absl::StrAppend(&out, ", \"block\": [", absl::StrJoin(l.quant.block, ", "), "]");
    }
    out += '}';
  }
  if (!l.scale_buffer.empty()) {
    absl::StrAppend(&out, ", \"scale_buffer\": ", json::Quote(l.scale_buffer));
  }
  if (l.has_scale_view || !l.scale_view.strides.empty() || l.scale_view.offset != 0) {
    AppendView(out, "scale_view", l.scale_view);
  }
  out += '}';
}

}  // namespace

std::string SpecToJson(const RefitSpec& spec) {
  std::string out = "{\n";
  if (!spec.comment.empty())
    absl::StrAppend(&out, "  \"comment\": ", json::Quote(spec.comment), ",\n");
  const Topology& topo = spec.topology;
  out += "  \"topology\": {";
  if (topo.ranks_per_domain > 0) {
    absl::StrAppend(&out, "\"ranks_per_domain\": ", topo.ranks_per_domain, ", ");
  } else if (!topo.domains.empty()) {
    out += "\"domains\": [";
    for (size_t i = 0; i < topo.domains.size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", "[", absl::StrJoin(topo.domains[i], ", "), "]");
    }
    out += "], ";
  }
  if (topo.gpus_per_node > 0)
    absl::StrAppend(&out, "\"gpus_per_node\": ", topo.gpus_per_node, ", ");
  absl::StrAppend(&out, "\"nic_gbytes_per_s\": ", topo.nic_gbytes_per_s,
                  ", \"nvlink_gbytes_per_s\": ", topo.nvlink_gbytes_per_s, "},\n");
  out += "  \"tensors\": [\n";
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    absl::StrAppend(&out, "    {\"name\": ", json::Quote(t.name), ", \"dtype\": \"",
                    std::string(DTypeName(t.dtype)), "\", \"shape\": [",
                    absl::StrJoin(t.shape, ", "), "],\n     \"src\": ");
    AppendLayout(out, t.src);
    out += ",\n     \"dst\": ";
    AppendLayout(out, t.dst);
    out += i + 1 < spec.tensors.size() ? "},\n" : "}\n";
  }
  out += "  ]\n}\n";
  return out;
}

}  // namespace reshard::plan
