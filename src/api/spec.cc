// Public spec types <-> the planner's spec (src/plan/spec.h).
#include "reshard/spec.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/api/internal.h"
#include "src/common/quant_math.h"
#include "src/common/status.h"
#include "src/plan/dtype.h"
#include "src/plan/plan.h"
#include "src/plan/quant_spec.h"
#include "src/plan/spec_json.h"
#include "src/plan/tiling.h"

namespace reshard {

int DTypeSize(DType dtype) { return plan::DTypeSize(static_cast<plan::DType>(dtype)); }
const char* DTypeName(DType dtype) {
  // DTypeName returns views of string literals, so data() is NUL-terminated.
  return plan::DTypeName(static_cast<plan::DType>(dtype)).data();
}
const char* SideName(Side side) { return side == Side::kSource ? "source" : "destination"; }

Mesh::Mesh(std::vector<int32_t> ranks)
    : shape_{static_cast<int64_t>(ranks.size())}, ranks_(std::move(ranks)) {}

Mesh::Mesh(std::initializer_list<std::initializer_list<int32_t>> rows) {
  int64_t cols = rows.size() == 0 ? 0 : static_cast<int64_t>(rows.begin()->size());
  for (const auto& row : rows) {
    // Ragged rows: keep a shape whose product differs from the rank count, so Validate names it.
    if (static_cast<int64_t>(row.size()) != cols) cols = -1;
    ranks_.insert(ranks_.end(), row.begin(), row.end());
  }
  shape_ = {static_cast<int64_t>(rows.size()), cols};
}

Mesh::Mesh(std::vector<int64_t> shape, std::vector<int32_t> ranks)
    : shape_(std::move(shape)), ranks_(std::move(ranks)) {}

Mesh Mesh::Range(int32_t first, int32_t count) {
  std::vector<int32_t> ranks(count > 0 ? count : 0);
  for (int32_t i = 0; i < count; ++i) ranks[i] = first + i;
  return Mesh(std::move(ranks));
}

Mesh Mesh::Reshape(std::vector<int64_t> shape) const { return Mesh(std::move(shape), ranks_); }

Layout& Layout::InBuffer(std::string buffer_name, int64_t offset, std::vector<int64_t> strides) {
  buffer = std::move(buffer_name);
  view_offset = offset;
  view_strides = std::move(strides);
  has_view = true;
  return *this;
}

Layout& Layout::Quantized(DType fp8, QuantScheme scheme, std::vector<int64_t> block) {
  dtype = fp8;
  quant_scheme = scheme;
  quant_block = std::move(block);
  return *this;
}

Layout& Layout::ScalesInBuffer(std::string buffer_name, int64_t offset,
                               std::vector<int64_t> strides) {
  scale_buffer = std::move(buffer_name);
  scale_view_offset = offset;
  scale_view_strides = std::move(strides);
  has_scale_view = true;
  return *this;
}

int64_t LocalTile::num_elements() const {
  int64_t n = 1;
  for (size_t d = 0; d < lo.size(); ++d) n *= hi[d] - lo[d];
  return n;
}

RefitSpec& RefitSpec::AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                Layout src, Layout dst) {
  tensors_.push_back(
      TensorDesc{std::move(name), dtype, std::move(shape), std::move(src), std::move(dst)});
  return *this;
}
RefitSpec& RefitSpec::SetDomains(std::vector<std::vector<int32_t>> domains) {
  domains_ = std::move(domains);
  ranks_per_domain_ = 0;
  return *this;
}
RefitSpec& RefitSpec::SetRanksPerDomain(int64_t n) {
  ranks_per_domain_ = n;
  domains_.clear();
  return *this;
}
RefitSpec& RefitSpec::SetComment(std::string comment) {
  comment_ = std::move(comment);
  return *this;
}

namespace {

static_assert(static_cast<int>(QuantScheme::kTensor) == static_cast<int>(plan::QuantScheme::kTensor) &&
                  static_cast<int>(QuantScheme::kMx) == static_cast<int>(plan::QuantScheme::kMx),
              "the public QuantScheme mirrors plan::QuantScheme");

plan::Layout ToPlan(const Layout& in) {
  plan::Layout out;
  out.mesh.shape = in.mesh.shape();
  out.mesh.ranks = in.mesh.ranks();
  for (const Placement& p : in.placements) {
    // A replicate's split factor travels too, so that Validate rejects one other than 1.
    plan::Placement q = p.shard ? plan::Placement::StridedShard(p.dim, p.split_factor)
                                : plan::Placement::Replicate();
    q.split_factor = p.split_factor;
    out.placements.push_back(q);
  }
  out.buffer = in.buffer;
  out.view.offset = in.view_offset;
  out.view.strides = in.view_strides;
  out.has_view = in.has_view;
  if (in.dtype) out.dtype = static_cast<plan::DType>(*in.dtype);
  out.quant.scheme = static_cast<plan::QuantScheme>(in.quant_scheme);
  out.quant.block = in.quant_block;
  out.scale_buffer = in.scale_buffer;
  out.scale_view.offset = in.scale_view_offset;
  out.scale_view.strides = in.scale_view_strides;
  out.has_scale_view = in.has_scale_view;
  return out;
}

Layout FromPlan(const plan::Layout& in) {
  Layout out(Mesh(in.mesh.shape, in.mesh.ranks), {});
  for (const plan::Placement& p : in.placements) {
    out.placements.push_back(p.is_shard() ? StridedShard(p.dim, p.split_factor) : Replicate());
  }
  out.buffer = in.buffer;
  out.view_offset = in.view.offset;
  out.view_strides = in.view.strides;
  out.has_view = in.has_view;
  if (in.dtype) out.dtype = static_cast<DType>(*in.dtype);
  out.quant_scheme = static_cast<QuantScheme>(in.quant.scheme);
  out.quant_block = in.quant.block;
  out.scale_buffer = in.scale_buffer;
  out.scale_view_offset = in.scale_view.offset;
  out.scale_view_strides = in.scale_view.strides;
  out.has_scale_view = in.has_scale_view;
  return out;
}

RefitSpec FromPlanSpec(const plan::RefitSpec& in) {
  RefitSpec out;
  out.SetComment(in.comment);
  for (const plan::TensorSpec& t : in.tensors) {
    out.AddTensor(t.name, static_cast<DType>(t.dtype), t.shape, FromPlan(t.src), FromPlan(t.dst));
  }
  if (!in.topology.domains.empty()) out.SetDomains(in.topology.domains);
  if (in.topology.ranks_per_domain > 0) out.SetRanksPerDomain(in.topology.ranks_per_domain);
  return out;
}

}  // namespace

namespace internal {

plan::RefitSpec ToPlanSpec(const RefitSpec& spec) {
  plan::RefitSpec out;
  out.comment = spec.comment();
  out.topology.domains = spec.domains();
  out.topology.ranks_per_domain = spec.ranks_per_domain();
  for (const TensorDesc& t : spec.tensors()) {
    plan::TensorSpec ts;
    ts.name = t.name;
    ts.dtype = static_cast<plan::DType>(t.dtype);
    ts.shape = t.shape;
    ts.src = ToPlan(t.src);
    ts.dst = ToPlan(t.dst);
    out.tensors.push_back(std::move(ts));
  }
  return out;
}

}  // namespace internal

absl::StatusOr<RefitSpec> RefitSpec::FromJson(const std::string& text) {
  RESHARD_ASSIGN_OR_RETURN(plan::RefitSpec spec, plan::ParseSpecJson(text));
  return FromPlanSpec(spec);
}

absl::StatusOr<RefitSpec> RefitSpec::FromFile(const std::string& path) {
  RESHARD_ASSIGN_OR_RETURN(plan::RefitSpec spec, plan::LoadSpecFile(path));
  return FromPlanSpec(spec);
}

std::string RefitSpec::ToJson() const { return plan::SpecToJson(internal::ToPlanSpec(*this)); }

absl::Status RefitSpec::Validate() const {
  if (tensors_.empty()) return absl::InvalidArgumentError("the refit spec lists no tensors");
  return plan::Validate(internal::ToPlanSpec(*this));
}

int32_t RefitSpec::WorldSize() const { return internal::ToPlanSpec(*this).WorldSize(); }

absl::StatusOr<std::vector<BufferRequirement>> RefitSpec::LocalBuffers(int32_t rank) const {
  if (tensors_.empty()) return absl::InvalidArgumentError("the refit spec lists no tensors");
  const plan::RefitSpec spec = internal::ToPlanSpec(*this);
  if (rank < 0) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is negative"));
  if (rank >= spec.WorldSize()) {
    RESHARD_RETURN_IF_ERROR(plan::Validate(spec));
    return std::vector<BufferRequirement>{};
  }
  // What the rank relies on, as RefitHandle::Create checks it (plan::ValidateForRank: every
  // structural check, buffer overlaps on this rank: the whole spec's overlap check grows with
  // the world's tiles); buffers do not depend on any plan.
  RESHARD_RETURN_IF_ERROR(plan::ValidateForRank(spec, rank));
  bool quantized = false;
  for (const plan::TensorSpec& t : spec.tensors) quantized = quantized || t.quantized();
  if (!quantized) return internal::Requirements(spec, plan::AssignBuffers(spec), rank);
  // Quantized destinations add scale buffers (plan::LowerQuantization, as planning does).
  RESHARD_ASSIGN_OR_RETURN(std::shared_ptr<const plan::RefitSpec> lowered,
                           plan::LowerQuantization(std::make_shared<plan::RefitSpec>(spec)));
  RESHARD_RETURN_IF_ERROR(plan::ValidateForRank(*lowered, rank));
  return internal::Requirements(*lowered, plan::AssignBuffers(*lowered), rank);
}

absl::StatusOr<std::vector<LocalTile>> RefitSpec::LocalTiles(int32_t rank, Side side) const {
  RESHARD_RETURN_IF_ERROR(Validate());
  // Destinations of quantized tensors: their FP8 tiles, then their scales' tiles (the lowered
  // spec's scale tensors, after the spec's own). Sources are the spec's as written, then the
  // scale tiles of FP8 sources (src.quant).
  auto user = std::make_shared<plan::RefitSpec>(internal::ToPlanSpec(*this));
  const size_t user_tensors = user->tensors.size();
  std::vector<std::string> scales_of(user_tensors);
  if (side == Side::kSource) {
    for (size_t t = 0; t < user_tensors; ++t) {
      if (!user->tensors[t].src_quantized()) continue;
      scales_of.push_back(user->tensors[t].name);
      user->tensors.push_back(plan::ScaleTensor(user->tensors[t], plan::Side::kSrc));
    }
  }
  std::shared_ptr<const plan::RefitSpec> shared = std::move(user);
  if (side == Side::kDestination) {
    RESHARD_ASSIGN_OR_RETURN(shared, plan::LowerQuantization(std::move(shared)));
    scales_of.resize(shared->tensors.size());
    for (size_t t = user_tensors; t < shared->tensors.size(); ++t) {
      const std::string& name = shared->tensors[t].name;
      scales_of[t] = name.substr(0, name.size() - 6);  // "<tensor>.scale"
    }
  }
  const plan::RefitSpec& spec = *shared;
  const plan::Side ps = side == Side::kSource ? plan::Side::kSrc : plan::Side::kDst;
  std::vector<LocalTile> out;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const plan::TensorSpec& ts = spec.tensors[t];
    const plan::Layout& layout = spec.layout(t, ps);
    plan::TileGrid grid(layout, ts.shape);
    const std::optional<plan::TileGrid::Cell> cell = grid.CellOfRank(rank);
    if (!cell) continue;
    const plan::Box box = grid.CellBox(*cell);
    std::array<int64_t, plan::kMaxTensorDims> strides{};
    plan::TileStrides(layout, box, strides);
    LocalTile tile;
    tile.tensor = ts.name;
    if (t >= user_tensors) tile.scales_of = scales_of[t];
    tile.buffer = ps == plan::Side::kSrc ? ts.src_buffer() : ts.dst_buffer();
    tile.side = side;
    tile.dtype = static_cast<DType>(side == Side::kSource ? ts.src_dtype() : ts.dst_dtype());
    tile.global_shape = ts.shape;
    for (int d = 0; d < box.ndim; ++d) {
      tile.lo.push_back(box.lo[d]);
      tile.hi.push_back(box.hi[d]);
      tile.strides.push_back(strides[d]);
    }
    tile.offset = layout.view.offset;
    out.push_back(std::move(tile));
  }
  return out;
}

std::vector<int64_t> QuantBlockShape(const std::vector<int64_t>& shape, QuantScheme scheme,
                                     const std::vector<int64_t>& block) {
  plan::TensorSpec t;
  t.shape = shape;
  t.dst.quant.scheme = static_cast<plan::QuantScheme>(scheme);
  t.dst.quant.block = block;
  return plan::BlockShape(t);
}

absl::Status QuantizeReference(DType src_dtype, const void* src,
                               const std::vector<int64_t>& extents, DType fp8, QuantScheme scheme,
                               const std::vector<int64_t>& block_shape, void* out, void* scales) {
  if (src_dtype != DType::kBf16 && src_dtype != DType::kFp16 && src_dtype != DType::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeReference quantizes bf16, fp16 or "
                                                   "fp32, not ", DTypeName(src_dtype)));
  }
  if (fp8 != DType::kFp8E4M3 && fp8 != DType::kFp8E5M2) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeReference writes fp8e4m3 or fp8e5m2, not ", DTypeName(fp8)));
  }
  if (scheme == QuantScheme::kNone) {
    return absl::InvalidArgumentError("QuantizeReference needs a quantization scheme");
  }
  const size_t ndim = extents.size();
  if (ndim > static_cast<size_t>(plan::kMaxTensorDims) || block_shape.size() != ndim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeReference: ", extents.size(), " extents and ", block_shape.size(),
        " block extents; give one block extent per dim, at most ", plan::kMaxTensorDims));
  }
  plan::QuantizedSource q;
  q.dtype = static_cast<plan::DType>(src_dtype);
  q.scheme = static_cast<plan::QuantScheme>(scheme);
  q.block = block_shape;
  plan::Box box;
  box.ndim = static_cast<int>(ndim);
  std::array<int64_t, plan::kMaxTensorDims> strides{};
  int64_t stride = 1;
  for (int d = static_cast<int>(ndim) - 1; d >= 0; --d) {
    if (extents[d] < 0 || extents[d] >= plan::kMaxSpecBytes || block_shape[d] < 1 ||
        block_shape[d] >= plan::kMaxSpecBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "QuantizeReference: dim ", d, " has extent ", extents[d], " and block ",
          block_shape[d], "; extents are >= 0, blocks >= 1, both below 2^62"));
    }
    box.hi[d] = extents[d];
    strides[d] = stride;
    stride *= extents[d];
  }
  if (box.NumElements() > 0 && (src == nullptr || out == nullptr || scales == nullptr)) {
    return absl::InvalidArgumentError("QuantizeReference: a null pointer for a non-empty tile");
  }
  plan::QuantizeBox(q, static_cast<plan::DType>(fp8), box, static_cast<const uint8_t*>(src),
                    strides, static_cast<uint8_t*>(out), static_cast<uint8_t*>(scales));
  return absl::OkStatus();
}

float DequantizeReference(DType fp8, uint8_t byte, QuantScheme scheme, const void* scale) {
  if ((fp8 != DType::kFp8E4M3 && fp8 != DType::kFp8E5M2) || scheme == QuantScheme::kNone ||
      scale == nullptr) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  float s;
  if (scheme == QuantScheme::kMx) {
    s = quant::MxScale(*static_cast<const uint8_t*>(scale));
  } else {
    std::memcpy(&s, scale, 4);
  }
  return quant::Dequantize(
      byte, s, fp8 == DType::kFp8E5M2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3);
}

}  // namespace reshard
