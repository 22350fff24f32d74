// The synthetic whole-model spec of plan_bench and plan_rank_bench (see plan_bench.cc for what
// it holds): DeepSeek-like, per-expert tensors between two 128-rank meshes, NVL8 domains.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/plan/spec.h"

namespace reshard::plan::bench {

constexpr int kDp = 16;
constexpr int kTp = 8;
constexpr int kInferenceBase = kDp * kTp;
constexpr int64_t kHidden = 7168;
constexpr int64_t kQ = 24576;
constexpr int64_t kKv = 576;
constexpr int64_t kSharedFfn = 2048;
constexpr int64_t kExpertFfn = 2048;
constexpr int kExpertsPerLayer = 64;
constexpr int64_t kStackedExperts = 160;
constexpr int64_t kVocab = 151937;

inline Mesh TrainerMesh() {
  Mesh m;
  m.shape = {kDp, kTp};
  for (int r = 0; r < kDp * kTp; ++r) m.ranks.push_back(r);  // rank = dp * 8 + tp
  return m;
}

inline Mesh InferenceMesh() {
  Mesh m;
  m.shape = {kDp, kTp};
  for (int dp = 0; dp < kDp; ++dp) {
    for (int tp = 0; tp < kTp; ++tp) m.ranks.push_back(kInferenceBase + tp * kDp + dp);
  }
  return m;
}

// The tp group of trainer dp row `dp`: a 1-D mesh of 8 ranks.
inline Mesh TrainerTpGroup(int dp) {
  Mesh m;
  m.shape = {kTp};
  for (int tp = 0; tp < kTp; ++tp) m.ranks.push_back(dp * kTp + tp);
  return m;
}

inline Placement R() { return Placement::Replicate(); }
inline Placement S(int d) { return Placement::Shard(d); }

class ModelBuilder {
 public:
  explicit ModelBuilder(size_t limit) : limit_(limit) {
    spec_.topology.ranks_per_domain = 8;
    spec_.tensors.reserve(limit);
  }

  bool full() const { return spec_.tensors.size() >= limit_; }

  void Add(std::string name, DType dtype, std::vector<int64_t> shape, Mesh src_mesh,
           std::vector<Placement> src, Mesh dst_mesh, std::vector<Placement> dst) {
    if (full()) return;
    TensorSpec t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.src.mesh = std::move(src_mesh);
    t.src.placements = std::move(src);
    t.dst.mesh = std::move(dst_mesh);
    t.dst.placements = std::move(dst);
    spec_.tensors.push_back(std::move(t));
  }

  RefitSpec Build() {
    const Mesh train = TrainerMesh(), infer = InferenceMesh();
    Add("model.embed_tokens.weight", DType::kBf16, {kVocab, kHidden}, train, {R(), S(0)}, infer,
        {R(), S(0)});
    Add("lm_head.weight", DType::kBf16, {kVocab, kHidden}, train, {R(), S(0)}, infer, {R(), S(0)});
    Add("model.norm.weight", DType::kBf16, {kHidden}, train, {R(), R()}, infer, {R(), R()});
    for (int layer = 0; !full(); ++layer) {
      const std::string p = absl::StrCat("model.layers.", layer, ".");
      Add(p + "input_layernorm.weight", DType::kBf16, {kHidden}, train, {R(), R()}, infer,
          {R(), R()});
      Add(p + "self_attn.q_proj.weight", DType::kBf16, {kQ, kHidden}, train, {R(), S(0)}, infer,
          {R(), S(0)});
      Add(p + "self_attn.kv_proj.weight", DType::kBf16, {kKv, kHidden}, train, {R(), S(0)}, infer,
          {R(), S(0)});
      Add(p + "self_attn.o_proj.weight", DType::kBf16, {kHidden, kQ / 3}, train, {R(), S(1)},
          infer, {R(), S(0)});
      Add(p + "post_attention_layernorm.weight", DType::kBf16, {kHidden}, train, {R(), R()}, infer,
          {R(), R()});
      Add(p + "mlp.gate.weight", DType::kFp32, {kExpertsPerLayer, kHidden}, train, {R(), R()},
          infer, {R(), R()});
      Add(p + "mlp.shared_experts.gate_up_proj.weight", DType::kBf16, {2 * kSharedFfn, kHidden},
          train, {R(), S(0)}, infer, {R(), S(0)});
      Add(p + "mlp.shared_experts.down_proj.weight", DType::kBf16, {kHidden, kSharedFfn}, train,
          {R(), S(1)}, infer, {R(), S(0)});
      for (int e = 0; e < kExpertsPerLayer; ++e) {
        const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
        const Mesh group = TrainerTpGroup(e % kDp);
        Add(x + "gate_proj.weight", DType::kFp8E4M3, {kExpertFfn, kHidden}, group, {S(0)}, infer,
            {R(), S(0)});
        Add(x + "up_proj.weight", DType::kFp8E4M3, {kExpertFfn, kHidden}, group, {S(0)}, infer,
            {R(), S(0)});
        Add(x + "down_proj.weight", DType::kFp8E4M3, {kHidden, kExpertFfn}, group, {S(1)}, infer,
            {R(), S(1)});
      }
      if (layer % 10 == 0) {
        Add(p + "mlp.stacked_experts.w13", DType::kBf16, {kStackedExperts, 2 * 1408, 2048}, train,
            {S(0), R()}, infer, {R(), S(1)});
        Add(p + "mlp.stacked_experts.w2", DType::kBf16, {kStackedExperts, 2048, 1408}, train,
            {S(0), R()}, infer, {R(), S(2)});
      }
    }
    return std::move(spec_);
  }

 private:
  size_t limit_;
  RefitSpec spec_;
};

// The issue-12 set-up case: `tensors` tensors between the same two 128-rank meshes, cycling
// through 2-D sharded layouts transposed between the sides (each destination tile overlaps
// several source tiles), replicated-and-sharded layouts and fully replicated ones.
inline RefitSpec MixedSpec(size_t tensors) {
  RefitSpec spec;
  spec.topology.ranks_per_domain = 8;
  spec.tensors.reserve(tensors);
  const Mesh train = TrainerMesh(), infer = InferenceMesh();
  for (size_t i = 0; i < tensors; ++i) {
    TensorSpec t;
    t.name = absl::StrCat("mixed.", i / 4, ".", i % 4);
    t.dtype = DType::kBf16;
    t.src.mesh = train;
    t.dst.mesh = infer;
    switch (i % 4) {
      case 0:  // 2-D sharded, transposed: [S(0), S(1)] -> [S(1), S(0)].
        t.shape = {4096, 4096};
        t.src.placements = {S(0), S(1)};
        t.dst.placements = {S(1), S(0)};
        break;
      case 1:  // Replicated over dp, sharded over tp on both sides (rank orders differ).
        t.shape = {4096, 4096};
        t.src.placements = {R(), S(0)};
        t.dst.placements = {R(), S(0)};
        break;
      case 2:  // Sharded over dp on trainers, over tp in inference.
        t.shape = {8192, 1024};
        t.src.placements = {S(0), R()};
        t.dst.placements = {R(), S(0)};
        break;
      default:  // Replicated everywhere.
        t.shape = {4096};
        t.src.placements = {R(), R()};
        t.dst.placements = {R(), R()};
        break;
    }
    spec.tensors.push_back(std::move(t));
  }
  return spec;
}

// The first `tensors` tensors of the synthetic model.
inline RefitSpec SyntheticSpec(size_t tensors) { return ModelBuilder(tensors).Build(); }

}  // namespace reshard::plan::bench
