// Trainer (Megatron) and inference (vLLM) layouts of a model, as a refit spec. docs/layouts.md
// describes the conventions with an example.
//
// Trainer side, ranks 0..T-1, order tp-cp-ep-dp-pp (tp fastest, pp slowest):
//   global rank = t + tp * (c + cp * (d + dp * p)) in the dense grid; the expert grid re-splits
//   each stage's tp*cp*dp ranks as etp x ep x edp (etp fastest, then ep):
//   rank = stage base + t' + etp * (e + ep * f).
//   Layers are split contiguously over pp stages (stage p holds [p*L/pp, (p+1)*L/pp)), the
//   embedding lives on the first stage, final norm and lm_head on the last. Column-parallel
//   weights shard dim 0 over tp, row-parallel dim 1, embedding and lm_head shard the vocab
//   (dim 0); norms, routers and MLA down-projections are replicated over the stage. Expert
//   stacks shard experts over ep and their intermediate dim over etp. Default etp = tp when
//   ep divides cp*dp; otherwise EP folds into the tp ranks (Megatron MoE parallel folding):
//   etp = the largest divisor of tp with etp*ep dividing tp*cp*dp (tp=4,ep=16,dp=4 -> etp=1).
// Inference side, ranks from B (T rounded up to a whole domain), rank = B + t + tp * d:
//   dense weights sharded over tp as above and replicated over dp; fused buffers per rank:
//   qkv_proj = [q; k; v], gate_up_proj = [gate; up], experts w13 = [E_local, 2*I_local, H]
//   with gate rows then up rows per expert, fused_qkv_a_proj = [q_a; kv_a] (MLA, replicated).
//   Experts: with ep > 1 the expert dim is sharded over ep consecutive ranks (expert TP 1);
//   otherwise the intermediate dim is sharded over tp.
// Per-expert tensors (ModelSpecOptions::experts = kPerExpert): expert K's matrices live where
//   the stack's slice K lives on each side. Trainer: the etp x edp ranks of the ep rank that
//   owns K, I over etp. Inference: only the ranks that own K (ep > 1), or every rank with I over
//   tp (ep = 1); each is a view into the same per-rank buffer the stack uses (w13_weight: gate
//   then up rows of local expert k at k * 2*I_l*H; down_proj: local expert k at k * H*I_l), so
//   both forms fill identical inference buffers.
// kv heads < tp (either side): tp must be a multiple of the kv heads; the tp axis splits into
// (kv_heads, tp / kv_heads) with placements (S(0), R), so each group of tp / kv_heads consecutive
// ranks holds one kv head, as vLLM and Megatron-style replication do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "src/plan/cluster.h"
#include "src/plan/dtype.h"
#include "src/plan/model.h"
#include "src/plan/spec.h"

namespace reshard::plan {

struct TrainParallelism {
  int64_t tp = 1, cp = 1, ep = 1, dp = 0 /*0: derive from gpus*/, pp = 1;
  int64_t etp = 0;   // Expert tensor parallel; 0: tp, folded down when ep needs the tp ranks.
  int64_t gpus = 0;  // Trainer GPU count ("gpus=N"); 0: tp*cp*dp*pp.
};
struct InferParallelism {
  int64_t tp = 1, dp = 1, ep = 1;
};

// "tp=4,pp=8,ep=16[,dp=..][,cp=..][,etp=..][,gpus=N]": keys in any order, each at most once,
// positive integers. InvalidArgument naming the key otherwise.
[[nodiscard]] absl::StatusOr<TrainParallelism> ParseTrainParallelism(const std::string& text);
// "tp=8,dp=16[,ep=..]".
[[nodiscard]] absl::StatusOr<InferParallelism> ParseInferParallelism(const std::string& text);
std::string ToString(const TrainParallelism& p);
std::string ToString(const InferParallelism& p);

struct ModelSpecOptions {
  DType dtype = DType::kBf16;
  int64_t train_gpus = 0;  // 0: from the parallelism (gpus=, or tp*cp*dp*pp).
  // Routed experts stacked (vLLM FusedMoE) or one tensor per expert matrix (Hugging Face
  // names); kPerExpert on a model without routed experts is an InvalidArgument ("experts: ...").
  ExpertTensors experts = ExpertTensors::kStacked;
  // Inference weights stored quantized (docs/quantization.md): every matrix but the embedding,
  // lm_head and the MoE router gets dst.dtype `infer_dtype` with `infer_quant`, as FP8
  // checkpoints (DeepSeek-V3, Kimi-K2) do. A matrix whose tiles would cut blocks stays in
  // `dtype`, as does every tensor of a fused buffer with such a member; the spec's comment says
  // how many were quantized.
  std::optional<DType> infer_dtype;
  Quant infer_quant{QuantScheme::kBlock, {128, 128}};
};

// Where the two sides sit in the refit world.
struct RankRanges {
  int32_t train_begin = 0, train_end = 0;  // [begin, end)
  int32_t infer_begin = 0, infer_end = 0;
};
// Trainer GPU count and inference base rank for these settings (the same rules MakeModelSpec
// uses). InvalidArgument as MakeModelSpec for inconsistent GPU counts.
[[nodiscard]] absl::StatusOr<RankRanges> ComputeRankRanges(const TrainParallelism& train,
                                                           const InferParallelism& infer,
                                                           const ClusterDesc& cluster,
                                                           const ModelSpecOptions& opts = {});

// Quantizes the destinations of `spec`'s matrices (ModelSpecOptions::infer_dtype): every tensor
// of 2 dims or more but embeddings, lm_head and MoE routers (by name) gets dst.dtype `fp8` with
// `quant` unless its tiles would cut a block (ValidateQuant), and a fused destination buffer
// keeps one element type (all its tensors or none). Appends what it did to spec.comment and
// returns the number of tensors quantized.
int64_t QuantizeMatrices(DType fp8, const Quant& quant, RefitSpec& spec);

// The full refit spec: every parameter of `cfg` with its trainer layout (src) and inference
// layout (dst), topology from the cluster (domains of gpus_per_domain consecutive ranks,
// bandwidths). The result passes Validate(). InvalidArgument naming the field when a
// parallelism degree does not divide what it splits: GPUs (dp, gpus), attention heads (tp),
// kv heads (tp), experts (ep), tp*cp*dp (ep, etp), layers (pp larger than the layer count);
// "experts" when per-expert tensors are asked of a model without routed experts.
[[nodiscard]] absl::StatusOr<RefitSpec> MakeModelSpec(const ModelConfig& cfg,
                                                      const TrainParallelism& train,
                                                      const InferParallelism& infer,
                                                      const ClusterDesc& cluster,
                                                      const ModelSpecOptions& opts = {});

}  // namespace reshard::plan
