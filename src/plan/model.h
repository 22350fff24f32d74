// Model descriptions: Hugging Face config.json files expanded into parameter lists (DESIGN §8).
//
// Supported model_type values: llama, qwen2, qwen3 (dense), qwen3_moe, deepseek_v3 and kimi_k2
// (multi-head latent attention, shared and routed experts, dense first layers). Multi-token
// prediction layers (num_nextn_predict_layers) are not part of the refitted model and are not
// expanded.
//
// Parameter names follow Hugging Face without the "model." prefix and without ".weight";
// biases end in ".bias". Routed experts are, by default (ExpertTensors::kStacked), one 3-D stack
// per layer and projection:
//   layers.N.mlp.experts.gate_proj [E, I, H]   (vLLM w1)
//   layers.N.mlp.experts.up_proj   [E, I, H]   (vLLM w3)
//   layers.N.mlp.experts.down_proj [E, H, I]   (vLLM w2)
// so that tensor counts stay small at DeepSeek scale. ExpertTensors::kPerExpert names every
// expert's matrices separately, as Hugging Face checkpoints do (DeepSeek-V3: ~45 k tensors):
//   layers.N.mlp.experts.K.gate_proj [I, H], layers.N.mlp.experts.K.up_proj [I, H],
//   layers.N.mlp.experts.K.down_proj [H, I]   for K = 0 .. E-1, in that order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard::plan {

// How a parameter is split by tensor parallelism (Megatron and vLLM agree on these roles).
enum class ParamRole : uint8_t {
  kEmbedding,       // [vocab, H]: vocab-parallel, dim 0.
  kLmHead,          // [vocab, H]: vocab-parallel, dim 0.
  kNorm,            // 1-D norm weights: replicated.
  kColumnParallel,  // Output dim 0 split over tp (q/k/v, gate/up, q_b, kv_b); also their biases.
  kRowParallel,     // Input dim 1 split over tp (o_proj, down_proj).
  kRouter,          // MoE router weight [E, H] and its correction bias [E]: replicated.
  kExpertColumn,    // [E, I, H] expert stack (gate, up): experts over EP, dim 1 over expert TP;
                    // one expert's [I, H] (ModelParam::expert >= 0): I over expert TP.
  kExpertRow,       // [E, H, I] expert stack (down): experts over EP, dim 2 over expert TP;
                    // one expert's [H, I]: I over expert TP.
  kReplicated,      // Other replicated weights (MLA q_a_proj, kv_a_proj_with_mqa).
};
const char* ParamRoleName(ParamRole role);

struct ModelParam {
  std::string name;
  std::vector<int64_t> shape;
  ParamRole role = ParamRole::kReplicated;
  int layer = -1;  // Decoder layer; -1 for embeddings, final norm and lm_head.
  // Inference-side fusion: "qkv", "qkv_bias", "gate_up", "w13", "qkv_a"; empty when none.
  // Members of one group in one layer (and module) share one buffer, in fuse_index order.
  std::string fuse_group;
  int fuse_index = 0;
  // Name of the fused inference parameter (vLLM's), e.g. "layers.3.self_attn.qkv_proj",
  // "layers.3.mlp.gate_up_proj", "layers.3.mlp.experts.w13_weight"; empty when none.
  std::string fused_name;
  // True for attention k/v projections (and their biases), whose dim 0 is kv heads x head_dim
  // and may be replicated when tp exceeds the number of kv heads.
  bool kv_heads = false;
  // The routed expert of a per-expert matrix (ExpertTensors::kPerExpert); -1 otherwise. Such a
  // matrix keeps the fused_name of its stack's buffer (w13_weight for gate and up, the
  // down_proj stack's name for down) and its fuse_index.
  int64_t expert = -1;
};

// How routed experts are expanded.
enum class ExpertTensors : uint8_t {
  kStacked,    // One [E, ...] stack per layer and projection (vLLM FusedMoE).
  kPerExpert,  // One tensor per expert matrix (Hugging Face checkpoint names).
};

// The Hugging Face fields the expansion reads. Absent optional fields take the Hugging Face
// defaults of the model type. Unknown fields are ignored (HF configs carry many).
struct ModelConfig {
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // Defaults to num_attention_heads.
  int64_t head_dim = 0;             // Defaults to hidden_size / num_attention_heads.
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (always true for qwen2).
  bool mlp_bias = false;        // llama mlp_bias.
  bool qk_norm = false;         // Per-head q_norm / k_norm (qwen3, qwen3_moe).
  std::string torch_dtype;      // As written in the config ("bfloat16"), may be empty.

  // Mixture of experts (0 routed experts: dense model).
  int64_t num_experts = 0;  // qwen3_moe num_experts, deepseek n_routed_experts.
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;          // deepseek: shared experts of moe_intermediate_size each.
  int64_t first_k_dense_replace = 0;     // deepseek: leading dense layers.
  int64_t moe_layer_freq = 1;            // deepseek: MoE every k-th layer after the dense ones.
  int64_t decoder_sparse_step = 1;       // qwen3_moe: MoE every k-th layer.
  std::vector<int64_t> mlp_only_layers;  // qwen3_moe: layers that stay dense.
  bool router_bias = false;              // deepseek e_score_correction_bias (noaux_tc routing).

  // Multi-head latent attention (deepseek_v3, kimi_k2).
  bool mla = false;
  int64_t q_lora_rank = 0;  // 0: no q compression (q_proj instead of q_a/q_b).
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // True when decoder layer `layer` has routed experts.
  bool IsMoeLayer(int64_t layer) const;
};

// Bounds on a config's integers, far above any model today, so that a mistyped or hostile
// config is refused with one sentence instead of expanding for minutes or overflowing: every
// integer field at most kMaxConfigInt (2^30: a product of two fields, or of one and a sum of two,
// fits in 64 bits), at most kMaxModelLayers decoder layers and kMaxModelExperts routed experts
// per layer. One tensor per expert (--per-expert) is further bounded by the spec's tensor limit
// (MakeModelSpec).
inline constexpr int64_t kMaxConfigInt = int64_t{1} << 30;
inline constexpr int64_t kMaxModelLayers = 1024;
inline constexpr int64_t kMaxModelExperts = 8192;

// Parses a config.json text; `origin` (a path) is named in errors. InvalidArgument for an
// unsupported model_type, missing required fields, fields of the wrong type or beyond the bounds
// above.
[[nodiscard]] absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view text,
                                                           const std::string& origin = "config");
// Reads and parses a file; NotFound when it cannot be read.
[[nodiscard]] absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// True when some decoder layer has routed experts.
bool HasRoutedExperts(const ModelConfig& cfg);

// Every parameter of the model, in a deterministic order: embeddings, then layer by layer
// (attention, norms, MLP or MoE), final norm, lm_head (absent when embeddings are tied).
// `experts` only changes MoE layers (a dense model expands the same either way).
std::vector<ModelParam> ExpandModel(const ModelConfig& cfg,
                                    ExpertTensors experts = ExpertTensors::kStacked);
int64_t TotalParameters(const std::vector<ModelParam>& params);

}  // namespace reshard::plan
