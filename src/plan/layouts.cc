#include "src/plan/layouts.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/checked.h"
#include "src/common/status.h"
#include "src/plan/quant_spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {

// Ranks are dense ids below this bound (as in spec.cc).
constexpr int64_t kMaxWorld = int64_t{1} << 20;

// Parses "k=v,k=v" into the integer fields named in `fields`, each at most once.
absl::Status ParseKeyValues(const std::string& text, const char* what,
                            const std::vector<std::pair<const char*, int64_t*>>& fields) {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " parallelism is empty"));
  }
  std::vector<std::string> seen;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::string entry(item);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " parallelism \"", text, "\": \"", entry, "\" is not key=value"));
    }
    const std::string key = entry.substr(0, eq);
    const std::string value = entry.substr(eq + 1);
    int64_t* target = nullptr;
    std::string allowed;
    for (const auto& [name, field] : fields) {
      if (key == name) target = field;
      absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", name);
    }
    if (target == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " parallelism \"", text, "\": unknown key \"", key, "\" (allowed: ", allowed, ")"));
    }
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " parallelism \"", text, "\": ", key, " is given twice"));
    }
    seen.push_back(key);
    int64_t n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 1 || n > kMaxWorld) {
      return absl::InvalidArgumentError(absl::StrCat(what, " parallelism \"", text, "\": ", key,
                                                     "=", value, " is not an integer in [1, ",
                                                     kMaxWorld, "]"));
    }
    *target = n;
  }
  return absl::OkStatus();
}

absl::Status FieldError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// Builds a mesh from row-major `shape` and a rank function of the flat index, dropping axes of
// size 1 (keeping at least one) so that meshes stay as small as the layout allows.
struct MeshBuilder {
  std::vector<int64_t> shape;
  std::vector<Placement> placements;

  template <typename RankFn>
  Layout Build(RankFn&& rank_of) const {
    Layout l;
    int64_t size = 1;
    for (size_t a = 0; a < shape.size(); ++a) {
      size *= shape[a];
      if (shape[a] > 1) {
        l.mesh.shape.push_back(shape[a]);
        l.placements.push_back(placements[a]);
      }
    }
    if (l.mesh.shape.empty()) {
      l.mesh.shape.push_back(1);
      l.placements.push_back(Placement::Replicate());
    }
    l.mesh.ranks.resize(size);
    for (int64_t i = 0; i < size; ++i) l.mesh.ranks[i] = static_cast<int32_t>(rank_of(i));
    return l;
  }
};

const Placement R = Placement::Replicate();
Placement S(int d) { return Placement::Shard(d); }

struct Resolved {
  TrainParallelism train;  // dp, etp and gpus resolved.
  InferParallelism infer;
  RankRanges ranks;
};

absl::StatusOr<Resolved> Resolve(const TrainParallelism& train, const InferParallelism& infer,
                                 const ClusterDesc& cluster, const ModelSpecOptions& opts) {
  Resolved r;
  r.train = train;
  r.infer = infer;
  TrainParallelism& t = r.train;
  for (const auto& [name, v] :
       {std::pair<const char*, int64_t>{"tp", t.tp}, {"cp", t.cp}, {"ep", t.ep}, {"pp", t.pp}}) {
    if (v < 1 || v > kMaxWorld) {
      return FieldError(absl::StrCat("train.", name), absl::StrCat(v, " is not a positive degree"));
    }
  }
  if (t.dp < 0 || t.dp > kMaxWorld) return FieldError("train.dp", "must be positive");
  if (t.etp < 0 || t.etp > kMaxWorld) return FieldError("train.etp", "must be positive");
  if (t.gpus < 0 || opts.train_gpus < 0) return FieldError("train.gpus", "must be positive");
  for (const auto& [name, v] :
       {std::pair<const char*, int64_t>{"tp", infer.tp}, {"dp", infer.dp}, {"ep", infer.ep}}) {
    if (v < 1 || v > kMaxWorld) {
      return FieldError(absl::StrCat("infer.", name), absl::StrCat(v, " is not a positive degree"));
    }
  }
  if (cluster.gpus_per_domain < 1) {
    return FieldError("cluster.gpus_per_domain", "must be positive");
  }
  int64_t gpus = opts.train_gpus > 0 ? opts.train_gpus : t.gpus;
  if (opts.train_gpus > 0 && t.gpus > 0 && opts.train_gpus != t.gpus) {
    return FieldError("train.gpus", absl::StrCat("gpus=", t.gpus, " disagrees with ",
                                                 opts.train_gpus, " trainer GPUs"));
  }
  const int64_t tcp = t.tp * t.cp * t.pp;
  if (tcp > kMaxWorld) return FieldError("train", "tp*cp*pp is too large");
  if (t.dp == 0) {
    if (gpus == 0) {
      return FieldError("train.dp", "give dp= or the trainer GPU count (gpus=) to derive it");
    }
    if (gpus % tcp != 0) {
      return FieldError("train.gpus", absl::StrCat(gpus,
                                                   " trainer GPUs are not a multiple of "
                                                   "tp*cp*pp = ",
                                                   tcp));
    }
    t.dp = gpus / tcp;
  } else if (gpus > 0 && tcp * t.dp != gpus) {
    return FieldError("train.dp", absl::StrCat("tp*cp*dp*pp = ", tcp * t.dp, " but there are ",
                                               gpus, " trainer GPUs"));
  }
  if (t.etp == 0) {
    // Expert tensor parallel defaults to tp; when ep does not fit in cp*dp it folds into the tp
    // ranks (Megatron MoE parallel folding): the largest divisor of tp with etp*ep | tp*cp*dp.
    t.etp = 1;
    for (int64_t e = t.tp; e >= 1; --e) {
      if (t.tp % e == 0 && (t.tp * t.cp * t.dp) % (e * t.ep) == 0) {
        t.etp = e;
        break;
      }
    }
  }
  const int64_t trainers = tcp * t.dp;
  const int64_t inference = infer.tp * infer.dp;
  if (trainers > kMaxWorld || inference > kMaxWorld) {
    return FieldError("train", "the refit world is too large");
  }
  t.gpus = trainers;
  const int64_t base =
      (trainers + cluster.gpus_per_domain - 1) / cluster.gpus_per_domain * cluster.gpus_per_domain;
  if (base + inference > kMaxWorld) return FieldError("infer", "the refit world is too large");
  r.ranks.train_begin = 0;
  r.ranks.train_end = static_cast<int32_t>(trainers);
  r.ranks.infer_begin = static_cast<int32_t>(base);
  r.ranks.infer_end = static_cast<int32_t>(base + inference);
  return r;
}

absl::Status CheckModel(const ModelConfig& cfg, const Resolved& r) {
  const TrainParallelism& t = r.train;
  const InferParallelism& i = r.infer;
  const int64_t heads = cfg.num_attention_heads;
  for (const auto& [side, tp] : {std::pair<const char*, int64_t>{"train", t.tp}, {"infer", i.tp}}) {
    const std::string field = absl::StrCat(side, ".tp");
    if (heads % tp != 0) {
      return FieldError(field,
                        absl::StrCat(tp, " does not divide num_attention_heads (", heads, ")"));
    }
    const int64_t kv = cfg.num_key_value_heads;
    if (!cfg.mla && kv % tp != 0 && tp % kv != 0) {
      return FieldError(field, absl::StrCat(tp,
                                            " neither divides nor is a multiple of "
                                            "num_key_value_heads (",
                                            kv, ")"));
    }
  }
  if (t.pp > cfg.num_hidden_layers) {
    return FieldError("train.pp", absl::StrCat(t.pp, " stages exceed num_hidden_layers (",
                                               cfg.num_hidden_layers, ")"));
  }
  if (!HasRoutedExperts(cfg)) return absl::OkStatus();
  const int64_t e = cfg.num_experts;
  if (e % t.ep != 0) {
    return FieldError("train.ep", absl::StrCat(t.ep, " does not divide the ", e, " experts"));
  }
  const int64_t stage = t.tp * t.cp * t.dp;
  if (stage % t.ep != 0) {
    return FieldError("train.ep", absl::StrCat(t.ep, " does not divide tp*cp*dp = ", stage));
  }
  if (stage % (t.etp * t.ep) != 0) {
    return FieldError("train.etp", absl::StrCat("etp*ep = ", t.etp * t.ep,
                                                " does not divide tp*cp*dp = ", stage));
  }
  if (e % i.ep != 0) {
    return FieldError("infer.ep", absl::StrCat(i.ep, " does not divide the ", e, " experts"));
  }
  if ((i.tp * i.dp) % i.ep != 0) {
    return FieldError("infer.ep", absl::StrCat(i.ep, " does not divide tp*dp = ", i.tp * i.dp));
  }
  return absl::OkStatus();
}

// First decoder layer of pipeline stage `s` (balanced contiguous split).
int64_t StageBegin(int64_t layers, int64_t pp, int64_t s) { return s * layers / pp; }

class SpecBuilder {
 public:
  SpecBuilder(const ModelConfig& cfg, const Resolved& r) : cfg_(cfg), r_(r) {
    const TrainParallelism& t = r_.train;
    stage_size_ = t.tp * t.cp * t.dp;
    layer_stage_.resize(cfg.num_hidden_layers);
    for (int64_t s = 0; s < t.pp; ++s) {
      for (int64_t l = StageBegin(cfg.num_hidden_layers, t.pp, s);
           l < StageBegin(cfg.num_hidden_layers, t.pp, s + 1); ++l) {
        layer_stage_[l] = s;
      }
    }
  }

  int64_t StageOf(const ModelParam& p) const {
    if (p.role == ParamRole::kEmbedding) return 0;
    if (p.layer < 0) return r_.train.pp - 1;
    return layer_stage_[p.layer];
  }

  // Megatron: dense grid [cp*dp, tp] (tp fastest), expert grid [edp, ep, etp] per stage.
  Layout Train(const ModelParam& p) const {
    const TrainParallelism& t = r_.train;
    const int64_t base = StageOf(p) * stage_size_;
    const int64_t reps = t.cp * t.dp;
    auto linear = [base](int64_t i) { return base + i; };
    switch (p.role) {
      case ParamRole::kNorm:
      case ParamRole::kRouter:
      case ParamRole::kReplicated:
        return MeshBuilder{{stage_size_}, {R}}.Build(linear);
      case ParamRole::kExpertColumn:
      case ParamRole::kExpertRow: {
        const int64_t edp = stage_size_ / (t.etp * t.ep);
        if (p.expert >= 0) {
          // The etp x edp ranks of the expert-parallel rank whose chunk of the stack holds K.
          const int64_t owner = ExpertOwner(p.expert, t.ep);
          const int64_t etp = t.etp, ep = t.ep;
          return MeshBuilder{{edp, etp}, {R, S(p.role == ParamRole::kExpertColumn ? 0 : 1)}}.Build(
              [&](int64_t i) { return base + i % etp + etp * (owner + ep * (i / etp)); });
        }
        const int inner = p.role == ParamRole::kExpertColumn ? 1 : 2;
        return MeshBuilder{{edp, t.ep, t.etp}, {R, S(0), S(inner)}}.Build(linear);
      }
      case ParamRole::kRowParallel:
        return MeshBuilder{{reps, t.tp}, {R, S(1)}}.Build(linear);
      case ParamRole::kEmbedding:
      case ParamRole::kLmHead:
      case ParamRole::kColumnParallel:
        return ColumnLayout(p, reps, t.tp, linear);
    }
    return {};
  }

  // vLLM: rank = base + t + tp*d; experts over ep consecutive ranks or intermediate over tp.
  Layout Infer(const ModelParam& p) const {
    const InferParallelism& i = r_.infer;
    const int64_t base = r_.ranks.infer_begin;
    auto linear = [base](int64_t k) { return base + k; };
    switch (p.role) {
      case ParamRole::kNorm:
      case ParamRole::kRouter:
      case ParamRole::kReplicated:
        return MeshBuilder{{i.tp * i.dp}, {R}}.Build(linear);
      case ParamRole::kExpertColumn:
      case ParamRole::kExpertRow: {
        const bool per_expert = p.expert >= 0;
        if (i.ep > 1) {
          if (per_expert) {  // Only the ranks whose chunk of the stack holds K, whole.
            const int64_t owner = ExpertOwner(p.expert, i.ep), ep = i.ep;
            return MeshBuilder{{i.tp * i.dp / i.ep}, {R}}.Build(
                [&](int64_t k) { return base + k * ep + owner; });
          }
          return MeshBuilder{{i.tp * i.dp / i.ep, i.ep}, {R, S(0)}}.Build(linear);
        }
        // The intermediate dim over tp: dim 1 (2) of a stack, dim 0 (1) of one expert's matrix.
        const int inner = (p.role == ParamRole::kExpertColumn ? 1 : 2) - (per_expert ? 1 : 0);
        return MeshBuilder{{i.dp, i.tp}, {R, S(inner)}}.Build(linear);
      }
      case ParamRole::kRowParallel:
        return MeshBuilder{{i.dp, i.tp}, {R, S(1)}}.Build(linear);
      case ParamRole::kEmbedding:
      case ParamRole::kLmHead:
      case ParamRole::kColumnParallel:
        return ColumnLayout(p, i.dp, i.tp, linear);
    }
    return {};
  }

 private:
  // Dim 0 over tp; kv projections with fewer heads than tp hold one head per tp/kv ranks.
  template <typename RankFn>
  Layout ColumnLayout(const ModelParam& p, int64_t reps, int64_t tp, RankFn&& rank_of) const {
    const int64_t kv = cfg_.num_key_value_heads;
    if (p.kv_heads && tp > kv) {
      return MeshBuilder{{reps, kv, tp / kv}, {R, S(0), R}}.Build(rank_of);
    }
    return MeshBuilder{{reps, tp}, {R, S(0)}}.Build(rank_of);
  }

  // The expert-parallel rank whose torch.chunk of the expert dim holds `expert`.
  int64_t ExpertOwner(int64_t expert, int64_t ep) const {
    return expert / ((cfg_.num_experts + ep - 1) / ep);
  }

  const ModelConfig& cfg_;
  const Resolved& r_;
  int64_t stage_size_ = 1;
  std::vector<int64_t> layer_stage_;
};

// Longest interval of dim `d` over the tiles of `layout`: the per-rank extent a fused buffer
// reserves for this member.
int64_t LongestTileDim(const Layout& layout, const std::vector<int64_t>& shape, int d) {
  TileGrid grid(layout, shape);
  int64_t longest = 0;
  for (const Interval& iv : grid.intervals(d)) longest = std::max(longest, iv.size());
  return longest;
}

// Places the members of one fused group (tensor indices in fuse_index order) as views into one
// per-rank buffer: concatenated along the fused dim (dim 1 of 3-D expert stacks, else dim 0).
void FuseViews(RefitSpec& spec, const std::vector<size_t>& members, const std::string& buffer) {
  const TensorSpec& first = spec.tensors[members.front()];
  const int ndim = static_cast<int>(first.shape.size());
  const int fuse_dim = ndim == 3 ? 1 : 0;
  // Per-member local extents of every dim (the longest tile), and the fused dim's total.
  std::vector<std::vector<int64_t>> local(members.size());
  int64_t fused_total = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    const TensorSpec& t = spec.tensors[members[m]];
    for (int d = 0; d < ndim; ++d) local[m].push_back(LongestTileDim(t.dst, t.shape, d));
    fused_total += local[m][fuse_dim];
  }
  // Row-major strides of the fused buffer [.., fused_total, ..] using the first member's other
  // extents (members of one group agree on them).
  std::vector<int64_t> strides(ndim);
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= d == fuse_dim ? fused_total : local[0][d];
  }
  int64_t offset_rows = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    TensorSpec& t = spec.tensors[members[m]];
    t.dst.buffer = buffer;
    t.dst.has_view = true;
    t.dst.view.offset = offset_rows * strides[fuse_dim];
    t.dst.view.strides = strides;
    offset_rows += local[m][fuse_dim];
  }
}

// One expert's matrix (ModelParam::expert >= 0) as a view into its stack's per-rank inference
// buffer, at the place the stacked tensor's slice K has there: gate (fuse_index 0) and up (1)
// rows of local expert k in w13_weight [E_l, 2*I_l, H], down in down_proj [E_l, H, I_l].
void ExpertView(const ModelParam& p, const ModelConfig& cfg, const InferParallelism& infer,
                TensorSpec& t) {
  const int64_t local_experts =
      infer.ep > 1 ? (cfg.num_experts + infer.ep - 1) / infer.ep : cfg.num_experts;
  const int64_t k = p.expert % local_experts;
  const bool column = p.role == ParamRole::kExpertColumn;
  const int64_t h = cfg.hidden_size;
  const int64_t inter = LongestTileDim(t.dst, t.shape, column ? 0 : 1);
  t.dst.buffer = p.fused_name;
  t.dst.has_view = true;
  if (column) {
    t.dst.view.offset = (k * 2 + p.fuse_index) * inter * h;
    t.dst.view.strides = {h, 1};
  } else {
    t.dst.view.offset = k * h * inter;
    t.dst.view.strides = {inter, 1};
  }
}

}  // namespace

absl::StatusOr<TrainParallelism> ParseTrainParallelism(const std::string& text) {
  TrainParallelism p;
  RESHARD_RETURN_IF_ERROR(ParseKeyValues(text, "train",
                                         {{"tp", &p.tp},
                                          {"cp", &p.cp},
                                          {"ep", &p.ep},
                                          {"dp", &p.dp},
                                          {"pp", &p.pp},
                                          {"etp", &p.etp},
                                          {"gpus", &p.gpus}}));
  return p;
}

absl::StatusOr<InferParallelism> ParseInferParallelism(const std::string& text) {
  InferParallelism p;
  RESHARD_RETURN_IF_ERROR(
      ParseKeyValues(text, "infer", {{"tp", &p.tp}, {"dp", &p.dp}, {"ep", &p.ep}}));
  return p;
}

std::string ToString(const TrainParallelism& p) {
  std::string s = absl::StrCat("tp=", p.tp, ",cp=", p.cp, ",ep=", p.ep, ",dp=", p.dp, ",pp=", p.pp);
  if (p.etp > 0) absl::StrAppend(&s, ",etp=", p.etp);
  if (p.gpus > 0) absl::StrAppend(&s, ",gpus=", p.gpus);
  return s;
}

std::string ToString(const InferParallelism& p) {
  return absl::StrCat("tp=", p.tp, ",dp=", p.dp, ",ep=", p.ep);
}

absl::StatusOr<RankRanges> ComputeRankRanges(const TrainParallelism& train,
                                             const InferParallelism& infer,
                                             const ClusterDesc& cluster,
                                             const ModelSpecOptions& opts) {
  RESHARD_ASSIGN_OR_RETURN(Resolved r, Resolve(train, infer, cluster, opts));
  return r.ranks;
}

int64_t QuantizeMatrices(DType fp8, const Quant& quant, RefitSpec& spec) {
  auto eligible = [](const TensorSpec& t) {
    return t.shape.size() >= 2 && !absl::StrContains(t.name, "embed_tokens") &&
           !absl::StrContains(t.name, "lm_head") && !absl::StrContains(t.name, "mlp.gate.weight");
  };
  int64_t quantized = 0, cut = 0;
  for (TensorSpec& t : spec.tensors) {
    if (!eligible(t)) continue;
    t.dst.dtype = fp8;
    t.dst.quant = quant;
    if (!ValidateQuant(t).ok()) {
      t.dst.dtype.reset();
      t.dst.quant = Quant{};
      ++cut;
    }
  }
  // A fused destination buffer holds one element type: all of its tensors, or none.
  absl::flat_hash_map<std::string, bool> mixed;  // Buffer -> some member not quantized.
  for (const TensorSpec& t : spec.tensors) mixed[t.dst_buffer()] |= !t.quantized();
  for (TensorSpec& t : spec.tensors) {
    if (t.quantized() && mixed[t.dst_buffer()]) {
      t.dst.dtype.reset();
      t.dst.quant = Quant{};
      ++cut;
    }
    quantized += t.quantized();
  }
  absl::StrAppend(&spec.comment, "; ", std::string(DTypeName(fp8)), " ", QuantSchemeName(quant.scheme),
                  quant.block.empty() ? "" : absl::StrCat(" [", absl::StrJoin(quant.block, ", "), "]"),
                  " destinations: ", quantized, " tensors (", cut,
                  " matrices left unquantized: their tiles, or a fused neighbour's, cut blocks)");
  return quantized;
}

absl::StatusOr<RefitSpec> MakeModelSpec(const ModelConfig& cfg, const TrainParallelism& train,
                                        const InferParallelism& infer, const ClusterDesc& cluster,
                                        const ModelSpecOptions& opts) {
  RESHARD_ASSIGN_OR_RETURN(Resolved r, Resolve(train, infer, cluster, opts));
  RESHARD_RETURN_IF_ERROR(CheckModel(cfg, r));
  if (opts.experts == ExpertTensors::kPerExpert && !HasRoutedExperts(cfg)) {
    return FieldError("experts", absl::StrCat("per-expert tensors need routed experts, and this ",
                                              cfg.model_type, " model has none"));
  }
  if (opts.experts == ExpertTensors::kPerExpert) {
    // Refused before expanding: millions of tensors take minutes and gigabytes to list.
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) moe_layers += cfg.IsMoeLayer(l) ? 1 : 0;
    // Saturating: a config built in code is not held to the parser's bounds (model.h).
    const int64_t expert_tensors = SaturatingMul(SaturatingMul(3, cfg.num_experts), moe_layers);
    if (expert_tensors > static_cast<int64_t>(kMaxTensors)) {
      return FieldError("experts",
                        absl::StrCat("one tensor per expert matrix makes ", expert_tensors,
                                     " tensors (", cfg.num_experts, " experts x 3 x ", moe_layers,
                                     " MoE layers); a spec holds at most ", kMaxTensors,
                                     " (use stacked experts)"));
    }
  }
  const std::vector<ModelParam> params = ExpandModel(cfg, opts.experts);
  RefitSpec spec;
  spec.comment = absl::StrCat(
      cfg.model_type, " train ", ToString(r.train), " -> infer ", ToString(r.infer), " on ",
      cluster.name, opts.experts == ExpertTensors::kPerExpert ? ", per-expert tensors" : "");
  spec.topology.ranks_per_domain = cluster.gpus_per_domain;
  spec.topology.gpus_per_node = cluster.gpus_per_node;
  spec.topology.nic_gbytes_per_s = cluster.nic_gbytes_per_s;
  spec.topology.nvlink_gbytes_per_s = cluster.nvlink_gbytes_per_s;
  SpecBuilder builder(cfg, r);
  spec.tensors.reserve(params.size());
  // Fused groups: buffer name -> member tensor indices by fuse_index.
  std::vector<std::pair<std::string, std::vector<std::pair<int, size_t>>>> groups;
  absl::flat_hash_map<std::string, size_t> group_index;
  for (const ModelParam& p : params) {
    TensorSpec t;
    t.name = p.name;
    t.dtype = opts.dtype;
    t.shape = p.shape;
    t.src = builder.Train(p);
    t.dst = builder.Infer(p);
    if (p.expert >= 0) {
      ExpertView(p, cfg, r.infer, t);
    } else if (!p.fused_name.empty()) {
      auto [it, inserted] = group_index.emplace(p.fused_name, groups.size());
      if (inserted) groups.push_back({p.fused_name, {}});
      groups[it->second].second.emplace_back(p.fuse_index, spec.tensors.size());
    }
    spec.tensors.push_back(std::move(t));
  }
  for (auto& [buffer, members] : groups) {
    std::sort(members.begin(), members.end());
    std::vector<size_t> order;
    for (const auto& [index, tensor] : members) order.push_back(tensor);
    FuseViews(spec, order, buffer);
  }
  if (opts.infer_dtype) QuantizeMatrices(*opts.infer_dtype, opts.infer_quant, spec);
  return spec;
}

}  // namespace reshard::plan
