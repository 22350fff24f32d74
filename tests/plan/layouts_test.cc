// Trainer (Megatron) and inference (vLLM) layouts: rank order, placements, fused views, errors,
// and end to end: generated specs validate, plan and verify in process.
#include "src/plan/layouts.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {

std::string ExamplePath(const std::string& rel) {
  return std::string(RESHARD_SOURCE_DIR) + "/examples/" + rel;
}

ModelConfig Model(const std::string& file) {
  auto cfg = LoadModelConfig(ExamplePath("models/" + file));
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : ModelConfig{};
}

ClusterDesc Cluster(const std::string& file) {
  auto c = LoadClusterFile(ExamplePath("clusters/" + file));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ClusterDesc{};
}

ClusterDesc SmallDomains(int64_t gpus_per_domain) {
  ClusterDesc c;
  c.name = "test";
  c.gpus_per_node = gpus_per_domain;
  c.gpus_per_domain = gpus_per_domain;
  return c;
}

RefitSpec MustSpec(const ModelConfig& cfg, const std::string& train, const std::string& infer,
                   const ClusterDesc& cluster, ExpertTensors experts = ExpertTensors::kStacked) {
  auto t = ParseTrainParallelism(train);
  auto i = ParseInferParallelism(infer);
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(i.ok()) << i.status();
  ModelSpecOptions opts;
  opts.experts = experts;
  auto spec = MakeModelSpec(cfg, *t, *i, cluster, opts);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : RefitSpec{};
}

const TensorSpec& Tensor(const RefitSpec& spec, const std::string& name) {
  for (const TensorSpec& t : spec.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  static TensorSpec none;
  return none;
}

// The box of `tensor` that `rank` holds on `side`.
Box TileOf(const TensorSpec& t, Side side, int32_t rank) {
  const Layout& l = side == Side::kSrc ? t.src : t.dst;
  TileGrid grid(l, t.shape);
  auto cell = grid.CellOfRank(rank);
  EXPECT_TRUE(cell.has_value()) << t.name << " rank " << rank;
  return cell ? grid.CellBox(*cell) : Box{};
}

std::pair<int64_t, int64_t> Rows(const Box& b, int d = 0) { return {b.lo[d], b.hi[d]}; }

TEST(ParseParallelismTest, ParsesAndRejects) {
  auto t = ParseTrainParallelism("tp=4,pp=8,ep=16,gpus=128");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tp, 4);
  EXPECT_EQ(t->pp, 8);
  EXPECT_EQ(t->ep, 16);
  EXPECT_EQ(t->dp, 0);
  EXPECT_EQ(t->cp, 1);
  EXPECT_EQ(t->gpus, 128);
  auto i = ParseInferParallelism("tp=8,dp=16");
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(i->tp, 8);
  EXPECT_EQ(i->dp, 16);
  EXPECT_EQ(i->ep, 1);
  for (const char* bad : {"", "tp=0", "tp=4,tp=4", "tq=4", "tp", "tp=x", "tp=-2"}) {
    auto r = ParseTrainParallelism(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ParseInferParallelism("tp=8,pp=2").ok());
  // A degree too large says so (it is a positive integer).
  auto huge = ParseTrainParallelism("tp=9999999999999999,gpus=8");
  EXPECT_NE(huge.status().message().find("tp=9999999999999999 is not an integer in [1, 1048576]"),
            std::string::npos)
      << huge.status();
}

TEST(LayoutsTest, DerivesDpAndStartsInferenceOnAFreshDomain) {
  auto t = ParseTrainParallelism("tp=4,pp=8,ep=16");
  auto i = ParseInferParallelism("tp=8,dp=16");
  ModelSpecOptions opts;
  opts.train_gpus = 128;
  auto ranks = ComputeRankRanges(*t, *i, Cluster("h100-nvl8.json"), opts);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ(ranks->train_end, 128);
  EXPECT_EQ(ranks->infer_begin, 128);
  EXPECT_EQ(ranks->infer_end, 256);
  auto t2 = ParseTrainParallelism("pp=16,ep=16,gpus=256");
  auto i2 = ParseInferParallelism("tp=32,dp=8");
  auto nvl72 = ComputeRankRanges(*t2, *i2, Cluster("gb200-nvl72.json"));
  ASSERT_TRUE(nvl72.ok()) << nvl72.status();
  EXPECT_EQ(nvl72->train_end, 256);
  EXPECT_EQ(nvl72->infer_begin, 288);  // 256 rounded up to whole 72-GPU domains.
  EXPECT_EQ(nvl72->infer_end, 544);
}

// tiny-moe: 5 layers (layer 0 dense), 8 heads, 2 kv heads, head_dim 16, H 64, 8 experts of 24.
TEST(LayoutsTest, TrainerFollowsMegatronRankOrder) {
  // tp=2, ep=2, dp=2 (derived from 8 GPUs), pp=2: stage 0 = ranks 0-3 (layers 0-1),
  // stage 1 = ranks 4-7 (layers 2-4). Dense rank = t + 2*d + 4*p.
  const RefitSpec spec =
      MustSpec(Model("tiny-moe.json"), "tp=2,ep=2,pp=2,gpus=8", "tp=2,dp=2", SmallDomains(4));
  const TensorSpec& q3 = Tensor(spec, "layers.3.self_attn.q_proj");
  EXPECT_EQ(q3.src.mesh.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(q3.src.mesh.ranks, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(q3.src.placements,
            (std::vector<Placement>{Placement::Replicate(), Placement::Shard(0)}));
  EXPECT_EQ(Rows(TileOf(q3, Side::kSrc, 5)), (std::pair<int64_t, int64_t>{64, 128}));
  const TensorSpec& o1 = Tensor(spec, "layers.1.self_attn.o_proj");
  EXPECT_EQ(o1.src.mesh.ranks, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Rows(TileOf(o1, Side::kSrc, 3), 1), (std::pair<int64_t, int64_t>{64, 128}));
  // Embedding on the first stage, final norm and lm_head on the last.
  EXPECT_EQ(Tensor(spec, "embed_tokens").src.mesh.ranks, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Tensor(spec, "lm_head").src.mesh.ranks, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(Tensor(spec, "norm").src.mesh.ranks, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(Tensor(spec, "norm").src.placements, (std::vector<Placement>{Placement::Replicate()}));
  // Vocab 250 over tp 2: torch.chunk rows [0,125) and [125,250).
  EXPECT_EQ(Rows(TileOf(Tensor(spec, "lm_head"), Side::kSrc, 7)),
            (std::pair<int64_t, int64_t>{125, 250}));
  // Experts: expert grid rank = t + etp*e (+ stage base), edp = 1; experts over ep, I over etp.
  const TensorSpec& w1 = Tensor(spec, "layers.4.mlp.experts.gate_proj");
  EXPECT_EQ(w1.src.mesh.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w1.src.placements, (std::vector<Placement>{Placement::Shard(0), Placement::Shard(1)}));
  const Box rank6 = TileOf(w1, Side::kSrc, 6);  // e = 1, t = 0
  EXPECT_EQ(Rows(rank6, 0), (std::pair<int64_t, int64_t>{4, 8}));
  EXPECT_EQ(Rows(rank6, 1), (std::pair<int64_t, int64_t>{0, 12}));
  const TensorSpec& w2 = Tensor(spec, "layers.4.mlp.experts.down_proj");
  EXPECT_EQ(Rows(TileOf(w2, Side::kSrc, 5), 2), (std::pair<int64_t, int64_t>{12, 24}));
  // Layer 0 is dense (mlp_only_layers) and lives on stage 0.
  EXPECT_EQ(Tensor(spec, "layers.0.mlp.down_proj").src.mesh.ranks,
            (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(LayoutsTest, ExpertParallelFoldsIntoTensorParallelRanksWhenDpIsTooSmall) {
  // tp=2, dp=2, ep=4: ep does not fit in dp, so etp = 1 and experts span all 4 stage ranks.
  const RefitSpec spec =
      MustSpec(Model("tiny-moe.json"), "tp=2,ep=4,dp=2", "tp=2,dp=2", SmallDomains(4));
  const TensorSpec& w1 = Tensor(spec, "layers.1.mlp.experts.gate_proj");
  EXPECT_EQ(w1.src.mesh.ranks, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(w1.src.placements, (std::vector<Placement>{Placement::Shard(0)}));
  EXPECT_EQ(Rows(TileOf(w1, Side::kSrc, 1)), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(Rows(TileOf(w1, Side::kSrc, 1), 1), (std::pair<int64_t, int64_t>{0, 24}));
}

TEST(LayoutsTest, InferenceUsesVllmFusedBuffers) {
  // Inference tp=2, dp=2 at ranks 8..11 (trainers fill the first two 4-GPU domains).
  const RefitSpec spec =
      MustSpec(Model("tiny-moe.json"), "tp=2,ep=2,pp=2,gpus=8", "tp=2,dp=2", SmallDomains(4));
  EXPECT_EQ(spec.topology.ranks_per_domain, 4);
  EXPECT_EQ(spec.topology.gpus_per_node, 4);
  const TensorSpec& q = Tensor(spec, "layers.2.self_attn.q_proj");
  const TensorSpec& k = Tensor(spec, "layers.2.self_attn.k_proj");
  const TensorSpec& v = Tensor(spec, "layers.2.self_attn.v_proj");
  EXPECT_EQ(q.dst.mesh.ranks, (std::vector<int32_t>{8, 9, 10, 11}));
  for (const TensorSpec* t : {&q, &k, &v}) {
    EXPECT_EQ(t->dst.buffer, "layers.2.self_attn.qkv_proj");
    EXPECT_EQ(t->dst.view.strides, (std::vector<int64_t>{64, 1}));
  }
  // Per rank: q 4 heads x 16 rows, then k 16 rows, then v 16 rows, each of H = 64.
  EXPECT_EQ(q.dst.view.offset, 0);
  EXPECT_EQ(k.dst.view.offset, 64 * 64);
  EXPECT_EQ(v.dst.view.offset, 80 * 64);
  EXPECT_EQ(Rows(TileOf(k, Side::kDst, 11)), (std::pair<int64_t, int64_t>{16, 32}));
  // Dense gate_up_proj in layer 0: [gate 48 rows; up 48 rows] per rank.
  const TensorSpec& up = Tensor(spec, "layers.0.mlp.up_proj");
  EXPECT_EQ(up.dst.buffer, "layers.0.mlp.gate_up_proj");
  EXPECT_EQ(up.dst.view.offset, 48 * 64);
  // Experts w13 = [E, 2*I_local, H]: gate rows [0, 12), up rows [12, 24) of every expert.
  const TensorSpec& w1 = Tensor(spec, "layers.3.mlp.experts.gate_proj");
  const TensorSpec& w3 = Tensor(spec, "layers.3.mlp.experts.up_proj");
  EXPECT_EQ(w1.dst.buffer, "layers.3.mlp.experts.w13_weight");
  EXPECT_EQ(w3.dst.buffer, "layers.3.mlp.experts.w13_weight");
  EXPECT_EQ(w1.dst.view.strides, (std::vector<int64_t>{24 * 64, 64, 1}));
  EXPECT_EQ(w3.dst.view.strides, (std::vector<int64_t>{24 * 64, 64, 1}));
  EXPECT_EQ(w1.dst.view.offset, 0);
  EXPECT_EQ(w3.dst.view.offset, 12 * 64);
  const Box up_tile = TileOf(w3, Side::kDst, 9);  // tp rank 1: intermediate rows [12, 24).
  EXPECT_EQ(Rows(up_tile, 0), (std::pair<int64_t, int64_t>{0, 8}));
  EXPECT_EQ(Rows(up_tile, 1), (std::pair<int64_t, int64_t>{12, 24}));
  // down_proj (w2) keeps its own buffer, intermediate dim 2 over tp.
  EXPECT_EQ(Rows(TileOf(Tensor(spec, "layers.3.mlp.experts.down_proj"), Side::kDst, 10), 2),
            (std::pair<int64_t, int64_t>{0, 12}));
  // Norms and routers are replicated on every inference rank.
  EXPECT_EQ(Tensor(spec, "layers.3.mlp.gate").dst.placements,
            (std::vector<Placement>{Placement::Replicate()}));
  EXPECT_EQ(Tensor(spec, "layers.3.mlp.gate").dst.mesh.size(), 4);
}

TEST(LayoutsTest, KvHeadsFewerThanTpAreReplicatedInGroups) {
  // tiny-moe has 2 kv heads; inference tp=4: ranks {0,1} hold head 0, {2,3} head 1.
  const RefitSpec spec =
      MustSpec(Model("tiny-moe.json"), "tp=2,dp=2,pp=1", "tp=4,dp=1", SmallDomains(4));
  const TensorSpec& k = Tensor(spec, "layers.1.self_attn.k_proj");
  EXPECT_EQ(k.dst.mesh.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(k.dst.placements,
            (std::vector<Placement>{Placement::Shard(0), Placement::Replicate()}));
  EXPECT_EQ(Rows(TileOf(k, Side::kDst, 5)), (std::pair<int64_t, int64_t>{0, 16}));
  EXPECT_EQ(Rows(TileOf(k, Side::kDst, 6)), (std::pair<int64_t, int64_t>{16, 32}));
  // qkv per rank: q 2 heads (32 rows), k 16 rows, v 16 rows.
  EXPECT_EQ(k.dst.view.offset, 32 * 64);
  EXPECT_EQ(Tensor(spec, "layers.1.self_attn.v_proj").dst.view.offset, 48 * 64);
}

TEST(LayoutsTest, InferenceExpertParallelShardsExperts) {
  const RefitSpec spec =
      MustSpec(Model("tiny-moe.json"), "tp=2,dp=2", "tp=2,dp=2,ep=4", SmallDomains(4));
  const TensorSpec& w3 = Tensor(spec, "layers.2.mlp.experts.up_proj");
  EXPECT_EQ(w3.dst.placements, (std::vector<Placement>{Placement::Shard(0)}));
  const Box tile = TileOf(w3, Side::kDst, 6);  // Inference rank 2 of 4.
  EXPECT_EQ(Rows(tile, 0), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_EQ(Rows(tile, 1), (std::pair<int64_t, int64_t>{0, 24}));
  EXPECT_EQ(w3.dst.view.strides, (std::vector<int64_t>{48 * 64, 64, 1}));
  EXPECT_EQ(w3.dst.view.offset, 24 * 64);
}

TEST(LayoutsTest, MlaFusesReplicatedDownProjections) {
  const RefitSpec spec =
      MustSpec(Model("tiny-mla.json"), "tp=2,ep=2,dp=2,pp=1", "tp=4,dp=1", SmallDomains(4));
  const TensorSpec& qa = Tensor(spec, "layers.1.self_attn.q_a_proj");
  const TensorSpec& kva = Tensor(spec, "layers.1.self_attn.kv_a_proj_with_mqa");
  EXPECT_EQ(qa.dst.buffer, "layers.1.self_attn.fused_qkv_a_proj");
  EXPECT_EQ(kva.dst.buffer, "layers.1.self_attn.fused_qkv_a_proj");
  EXPECT_EQ(kva.dst.view.offset, 32 * 64);
  EXPECT_EQ(qa.src.placements, (std::vector<Placement>{Placement::Replicate()}));
  // kv_b_proj is column parallel: 4 heads x (8 + 8) rows over tp 4.
  EXPECT_EQ(Rows(TileOf(Tensor(spec, "layers.1.self_attn.kv_b_proj"), Side::kDst, 7)),
            (std::pair<int64_t, int64_t>{48, 64}));
  EXPECT_EQ(Tensor(spec, "layers.2.mlp.shared_experts.up_proj").dst.buffer,
            "layers.2.mlp.shared_experts.gate_up_proj");
}

// One tensor per expert matrix of a config at the bounds (8,192 experts in 1,024 MoE layers) would
// be 25 M tensors: refused before expanding, in one sentence that names the count and the way
// out.
TEST(LayoutsTest, PerExpertTensorsBeyondTheSpecLimitAreRefusedBeforeExpanding) {
  ModelConfig cfg = Model("tiny-moe.json");
  cfg.num_experts = kMaxModelExperts;
  cfg.num_hidden_layers = kMaxModelLayers;
  cfg.mlp_only_layers.clear();
  cfg.decoder_sparse_step = 1;
  auto t = ParseTrainParallelism("tp=2,ep=2,pp=2,gpus=8");
  auto i = ParseInferParallelism("tp=2,dp=2");
  ASSERT_TRUE(t.ok() && i.ok());
  ModelSpecOptions opts;
  opts.experts = ExpertTensors::kPerExpert;
  auto spec = MakeModelSpec(cfg, *t, *i, SmallDomains(4), opts);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  const std::string message(spec.status().message());
  EXPECT_NE(message.find("25165824 tensors (8192 experts x 3 x 1024 MoE layers)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("use stacked experts"), std::string::npos) << message;
}

// Per-expert tensors sit where the stack's slice K sits on both sides: the trainer ranks of the
// owning expert-parallel rank (I over expert TP), and the inference ranks holding K, as views
// into the same w13_weight / down_proj buffers the stacks fill.
TEST(LayoutsTest, PerExpertTensorsLiveWhereTheStacksSliceLives) {
  // Trainer stage 1 = ranks 4..7 (etp 2, ep 2: rank 6 and 7 hold experts 4..7); inference
  // tp=2, dp=2 at ranks 8..11 with the experts' intermediate dim over tp.
  const RefitSpec spec = MustSpec(Model("tiny-moe.json"), "tp=2,ep=2,pp=2,gpus=8", "tp=2,dp=2",
                                  SmallDomains(4), ExpertTensors::kPerExpert);
  EXPECT_EQ(spec.tensors.size(), 146u);
  EXPECT_TRUE(Validate(spec).ok()) << Validate(spec);
  const TensorSpec& gate = Tensor(spec, "layers.3.mlp.experts.5.gate_proj");
  const TensorSpec& up = Tensor(spec, "layers.3.mlp.experts.5.up_proj");
  const TensorSpec& down = Tensor(spec, "layers.3.mlp.experts.5.down_proj");
  EXPECT_EQ(gate.shape, (std::vector<int64_t>{24, 64}));
  EXPECT_EQ(down.shape, (std::vector<int64_t>{64, 24}));
  for (const TensorSpec* t : {&gate, &up, &down}) {
    EXPECT_EQ(t->src.mesh.ranks, (std::vector<int32_t>{6, 7})) << t->name;
    EXPECT_EQ(t->dst.mesh.ranks, (std::vector<int32_t>{8, 9, 10, 11})) << t->name;
    EXPECT_EQ(t->dst.mesh.shape, (std::vector<int64_t>{2, 2})) << t->name;
    EXPECT_TRUE(t->src.buffer.empty()) << t->name;
    EXPECT_FALSE(t->src.has_view) << t->name;
  }
  EXPECT_EQ(gate.src.placements, (std::vector<Placement>{Placement::Shard(0)}));
  EXPECT_EQ(down.src.placements, (std::vector<Placement>{Placement::Shard(1)}));
  EXPECT_EQ(gate.dst.placements,
            (std::vector<Placement>{Placement::Replicate(), Placement::Shard(0)}));
  EXPECT_EQ(down.dst.placements,
            (std::vector<Placement>{Placement::Replicate(), Placement::Shard(1)}));
  EXPECT_EQ(Rows(TileOf(up, Side::kSrc, 7)), (std::pair<int64_t, int64_t>{12, 24}));
  EXPECT_EQ(Rows(TileOf(down, Side::kSrc, 6), 1), (std::pair<int64_t, int64_t>{0, 12}));
  EXPECT_EQ(Rows(TileOf(up, Side::kDst, 11)), (std::pair<int64_t, int64_t>{12, 24}));
  // w13_weight per rank is [8, 24, 64]: expert 5's gate rows at 5*24*64, its up rows 12*64 on.
  EXPECT_EQ(gate.dst.buffer, "layers.3.mlp.experts.w13_weight");
  EXPECT_EQ(up.dst.buffer, "layers.3.mlp.experts.w13_weight");
  EXPECT_EQ(gate.dst.view.offset, 5 * 24 * 64);
  EXPECT_EQ(up.dst.view.offset, 5 * 24 * 64 + 12 * 64);
  EXPECT_EQ(gate.dst.view.strides, (std::vector<int64_t>{64, 1}));
  EXPECT_EQ(up.dst.view.strides, (std::vector<int64_t>{64, 1}));
  // down_proj per rank is [8, 64, 12].
  EXPECT_EQ(down.dst.buffer, "layers.3.mlp.experts.down_proj");
  EXPECT_EQ(down.dst.view.offset, 5 * 64 * 12);
  EXPECT_EQ(down.dst.view.strides, (std::vector<int64_t>{12, 1}));
  // Experts 0..3 live on trainer ranks 4 and 5; stage 0 (layer 1) on ranks 2 and 3.
  EXPECT_EQ(Tensor(spec, "layers.3.mlp.experts.3.down_proj").src.mesh.ranks,
            (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(Tensor(spec, "layers.1.mlp.experts.7.gate_proj").src.mesh.ranks,
            (std::vector<int32_t>{2, 3}));
  EXPECT_NE(spec.comment.find("per-expert"), std::string::npos) << spec.comment;
}

TEST(LayoutsTest, PerExpertTensorsGoOnlyToTheOwningRanksUnderInferenceExpertParallelism) {
  // Inference tp=2, dp=2, ep=4 at ranks 4..7: two experts per rank, whole. Trainer etp 2, edp 2.
  const RefitSpec spec = MustSpec(Model("tiny-moe.json"), "tp=2,dp=2", "tp=2,dp=2,ep=4",
                                  SmallDomains(4), ExpertTensors::kPerExpert);
  const TensorSpec& up = Tensor(spec, "layers.2.mlp.experts.5.up_proj");
  EXPECT_EQ(up.dst.mesh.ranks, (std::vector<int32_t>{6}));
  EXPECT_EQ(up.dst.placements, (std::vector<Placement>{Placement::Replicate()}));
  EXPECT_EQ(up.dst.view.offset, (1 * 48 + 24) * 64);  // Local expert 1 of [2, 48, 64].
  EXPECT_EQ(Tensor(spec, "layers.2.mlp.experts.5.down_proj").dst.view.offset, 1 * 64 * 24);
  EXPECT_EQ(up.src.mesh.ranks, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(up.src.placements,
            (std::vector<Placement>{Placement::Replicate(), Placement::Shard(0)}));
  // Expert parallelism folded into the trainer's tp ranks (etp 1): expert 5 whole on rank 2.
  const RefitSpec folded = MustSpec(Model("tiny-moe.json"), "tp=2,ep=4,dp=2", "tp=2,dp=2",
                                    SmallDomains(4), ExpertTensors::kPerExpert);
  EXPECT_EQ(Tensor(folded, "layers.1.mlp.experts.5.gate_proj").src.mesh.ranks,
            (std::vector<int32_t>{2}));
}

TEST(LayoutsTest, PerExpertTensorsOfADenseModelAreAnError) {
  ModelSpecOptions per_expert;
  per_expert.experts = ExpertTensors::kPerExpert;
  auto spec = MakeModelSpec(Model("qwen3-32b.json"), *ParseTrainParallelism("tp=8,dp=1"),
                            *ParseInferParallelism("tp=8"), SmallDomains(8), per_expert);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(spec.status().message()),
            "experts: per-expert tensors need routed experts, and this qwen3 model has none");
}

// Bytes of every destination buffer on every rank, by buffer name.
std::map<std::pair<int32_t, std::string>, int64_t> DstBufferBytes(const Plan& plan) {
  std::map<std::pair<int32_t, std::string>, int64_t> out;
  for (int32_t r = 0; r < plan.world_size(); ++r) {
    const std::vector<int64_t> bytes = plan.BufferBytes(r);
    for (size_t b = 0; b < bytes.size(); ++b) {
      if (plan.buffers()[b].side == Side::kDst && bytes[b] > 0) {
        out[{r, plan.buffers()[b].name}] = bytes[b];
      }
    }
  }
  return out;
}

// Bytes of destination tiles each rank holds: what the refit writes into it.
std::vector<int64_t> DstTileBytes(const RefitSpec& spec) {
  std::vector<int64_t> out(spec.WorldSize(), 0);
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    ForEachTile(spec, t, Side::kDst, [&](int32_t rank, const Box& box) {
      out[rank] += box.NumElements() * DTypeSize(spec.tensors[t].dtype);
    });
  }
  return out;
}

struct EndToEnd {
  const char* model;
  const char* train;
  const char* infer;
  int64_t gpus_per_domain;
};

class EndToEndTest : public ::testing::TestWithParam<EndToEnd> {};

TEST_P(EndToEndTest, SpecValidatesPlansAndVerifiesInProcess) {
  const EndToEnd& c = GetParam();
  const RefitSpec spec =
      MustSpec(Model(c.model), c.train, c.infer, SmallDomains(c.gpus_per_domain));
  ASSERT_TRUE(Validate(spec).ok()) << Validate(spec);
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->stats().pieces, 0);
  // Every destination byte is written: the destination total is the model times its replicas.
  const absl::Status verified = VerifyPlanInProcess(*plan, int64_t{1} << 30);
  EXPECT_TRUE(verified.ok()) << verified;
}

// The per-expert form of the same model and parallelism verifies too, and fills exactly the
// inference buffers the stacked form fills, with the same bytes on every destination rank.
TEST_P(EndToEndTest, PerExpertSpecFillsTheSameBuffersAsTheStackedOne) {
  const EndToEnd& c = GetParam();
  const RefitSpec stacked =
      MustSpec(Model(c.model), c.train, c.infer, SmallDomains(c.gpus_per_domain));
  const RefitSpec per_expert = MustSpec(Model(c.model), c.train, c.infer,
                                        SmallDomains(c.gpus_per_domain), ExpertTensors::kPerExpert);
  ASSERT_GT(per_expert.tensors.size(), stacked.tensors.size());
  ASSERT_TRUE(Validate(per_expert).ok()) << Validate(per_expert);
  auto stacked_plan = BuildPlan(std::make_shared<const RefitSpec>(stacked));
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(per_expert));
  ASSERT_TRUE(stacked_plan.ok()) << stacked_plan.status();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stats().bytes_dst_total, stacked_plan->stats().bytes_dst_total);
  EXPECT_EQ(DstTileBytes(per_expert), DstTileBytes(stacked));
  EXPECT_EQ(DstBufferBytes(*plan), DstBufferBytes(*stacked_plan));
  const absl::Status verified = VerifyPlanInProcess(*plan, int64_t{1} << 30);
  EXPECT_TRUE(verified.ok()) << verified;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, EndToEndTest,
    ::testing::Values(EndToEnd{"tiny-moe.json", "tp=2,ep=2,pp=2,gpus=8", "tp=2,dp=2", 4},
                      EndToEnd{"tiny-moe.json", "tp=1,ep=4,pp=3,gpus=12", "tp=4,dp=2", 8},
                      EndToEnd{"tiny-moe.json", "tp=2,cp=2,ep=2,dp=1,pp=1", "tp=2,dp=2,ep=4", 4},
                      EndToEnd{"tiny-moe.json", "tp=4,ep=2,etp=1,dp=2", "tp=8,dp=1", 8},
                      EndToEnd{"tiny-mla.json", "tp=2,ep=2,dp=2,pp=3", "tp=4,dp=2", 4},
                      EndToEnd{"tiny-mla.json", "pp=2,ep=4,gpus=8", "tp=2,dp=2,ep=2", 8}));

TEST(LayoutsTest, ErrorsNameTheField) {
  const ModelConfig moe = Model("tiny-moe.json");  // 8 heads, 2 kv heads, 8 experts, 5 layers.
  const ClusterDesc cluster = SmallDomains(8);
  struct Case {
    const char* train;
    const char* infer;
    const char* field;
  };
  for (const Case& c : std::vector<Case>{
           {"tp=3,dp=1", "tp=2,dp=1", "train.tp"},
           {"tp=2,dp=1", "tp=16,dp=1", "infer.tp"},
           {"tp=2,gpus=7", "tp=2,dp=1", "train.gpus"},
           {"tp=2,dp=2,gpus=8", "tp=2,dp=1", "train.dp"},
           {"tp=2", "tp=2,dp=1", "train.dp"},
           {"tp=1,ep=3,dp=3", "tp=2,dp=1", "train.ep"},
           {"tp=1,ep=4,dp=2", "tp=2,dp=1", "train.ep"},
           {"tp=2,ep=2,etp=2,dp=1", "tp=2,dp=1", "train.etp"},
           {"tp=1,dp=2,pp=6", "tp=2,dp=1", "train.pp"},
           {"tp=1,dp=2", "tp=2,dp=2,ep=3", "infer.ep"},
           {"tp=1,dp=2", "tp=2,dp=1,ep=4", "infer.ep"},
       }) {
    auto t = ParseTrainParallelism(c.train);
    auto i = ParseInferParallelism(c.infer);
    ASSERT_TRUE(t.ok() && i.ok()) << c.train << " " << c.infer;
    auto spec = MakeModelSpec(moe, *t, *i, cluster);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.train << " " << c.infer;
    EXPECT_EQ(std::string(spec.status().message()).rfind(c.field, 0), 0u)
        << c.train << " " << c.infer << ": " << spec.status();
  }
  // Option and parallelism disagree on the trainer GPU count.
  ModelSpecOptions opts;
  opts.train_gpus = 16;
  auto spec = MakeModelSpec(moe, *ParseTrainParallelism("tp=2,gpus=8"),
                            *ParseInferParallelism("tp=2"), cluster, opts);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

// A real model plans at full size: every inference replica receives the whole model once.
TEST(LayoutsTest, Qwen3MoePlansEveryByteOfEveryReplica) {
  const ModelConfig cfg = Model("qwen3-30b-a3b.json");
  const RefitSpec spec = MustSpec(cfg, "tp=2,pp=2,ep=2,gpus=8", "tp=2,dp=2", SmallDomains(8));
  EXPECT_EQ(spec.WorldSize(), 12);
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Each destination tile lands once on each of its holders: sharded tensors twice (dp = 2),
  // replicated ones (norms, routers) on all four ranks.
  int64_t expected = 0;
  for (const TensorSpec& t : spec.tensors) {
    int64_t bytes = 2;  // bf16
    for (int64_t n : t.shape) bytes *= n;
    expected += bytes * TileGrid(t.dst, t.shape).num_replicas();
  }
  EXPECT_GT(expected, TotalParameters(ExpandModel(cfg)) * 2 * 2);
  EXPECT_LT(expected, TotalParameters(ExpandModel(cfg)) * 2 * 2 * 1001 / 1000);
  EXPECT_EQ(plan->stats().bytes_dst_total, expected);
}

// The published rows of issue 3 generate valid specs of the expected shape at full scale, and so
// does DeepSeek-V3 with one tensor per expert matrix into 512 inference GPUs (23.8 M pieces, which
// the bound on a plan's pieces refused while it was 2^24).
TEST(LayoutsTest, FullScaleSpecsValidate) {
  struct Row {
    const char* model;
    const char* cluster;
    const char* train;
    const char* infer;
    int32_t world;
    ExpertTensors experts = ExpertTensors::kStacked;
  };
  for (const Row& r : std::vector<Row>{
           {"qwen3-235b-a22b.json", "h100-nvl8.json", "tp=4,pp=8,ep=16,gpus=128", "tp=8,dp=16",
            256},
           {"deepseek-v3.json", "h100-nvl8.json", "pp=16,ep=16,gpus=256", "tp=32,dp=8", 512},
           {"deepseek-v3.json", "gb200-nvl72.json", "pp=16,ep=16,gpus=256", "tp=32,dp=8", 544},
           {"kimi-k2.json", "h100-nvl8.json", "pp=16,ep=16,gpus=256", "tp=16,dp=8", 384},
           {"deepseek-v3.json", "h100-nvl8.json", "pp=16,ep=16,gpus=256", "tp=32,dp=16", 768,
            ExpertTensors::kPerExpert},
       }) {
    SCOPED_TRACE(std::string(r.model) + " " + r.infer);
    const ModelConfig cfg = Model(r.model);
    const RefitSpec spec = MustSpec(cfg, r.train, r.infer, Cluster(r.cluster), r.experts);
    EXPECT_EQ(spec.WorldSize(), r.world);
    EXPECT_EQ(spec.tensors.size(), ExpandModel(cfg, r.experts).size());
    const absl::Status valid = Validate(spec);
    EXPECT_TRUE(valid.ok()) << valid;
  }
}

// --infer-dtype: FP8 inference matrices (DeepSeek-V3 style 128 x 128 blocks) from a bf16 trainer.
// Every matrix but the embedding, lm_head and router is quantized when its tiles allow, the spec
// validates, plans and verifies in process, and the network carries fewer bytes (this model is
// tiny: its unquantized embedding and lm_head and the scales of 16 x 16 blocks weigh much more
// than in a real one, where `reshard sim --infer-dtype` shows half the bytes).
TEST(LayoutsTest, Fp8InferenceMatricesHalveTheNetworkBytes) {
  const ModelConfig cfg = Model("tiny-moe.json");
  auto t = ParseTrainParallelism("tp=2,ep=2,gpus=4");
  auto i = ParseInferParallelism("tp=2,dp=2");
  ASSERT_TRUE(t.ok() && i.ok());
  ModelSpecOptions opts;
  auto bf16 = MakeModelSpec(cfg, *t, *i, SmallDomains(2), opts);
  opts.infer_dtype = DType::kFp8E4M3;
  opts.infer_quant = Quant{QuantScheme::kBlock, {16, 16}};
  auto fp8 = MakeModelSpec(cfg, *t, *i, SmallDomains(2), opts);
  ASSERT_TRUE(bf16.ok() && fp8.ok()) << fp8.status();
  int quantized = 0;
  for (const TensorSpec& ts : fp8->tensors) {
    quantized += ts.quantized();
    if (ts.name.find("embed_tokens") != std::string::npos ||
        ts.name.find("lm_head") != std::string::npos || ts.shape.size() < 2) {
      EXPECT_FALSE(ts.quantized()) << ts.name;
    }
  }
  EXPECT_GT(quantized, 0);
  EXPECT_NE(fp8->comment.find(absl::StrCat("destinations: ", quantized, " tensors")),
            std::string::npos)
      << fp8->comment;
  auto plan_bf16 = BuildPlan(std::make_shared<const RefitSpec>(*bf16));
  auto plan_fp8 = BuildPlan(std::make_shared<const RefitSpec>(*fp8));
  ASSERT_TRUE(plan_bf16.ok() && plan_fp8.ok()) << plan_fp8.status();
  EXPECT_LT(plan_fp8->stats().bytes_network, plan_bf16->stats().bytes_network);
  EXPECT_TRUE(VerifyPlanInProcess(*plan_fp8, int64_t{1} << 30).ok());
}

}  // namespace
}  // namespace reshard::plan
