#include "src/plan/model.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "src/common/json.h"
#include "src/common/status.h"

namespace reshard::plan {
namespace {

using json::Value;

class ConfigReader {
 public:
  ConfigReader(const Value& doc, const std::string& origin) : doc_(doc), origin_(origin) {}

  absl::Status Error(const Value* at, const std::string& key, const std::string& message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, at ? absl::StrCat(": ", at->Where()) : std::string(),
                     ": config field \"", key, "\" ", message));
  }

  // Reads a non-negative integer; absent or null leaves `out` unchanged unless required.
  absl::Status Int(const std::string& key, int64_t& out, bool required = false,
                   bool positive = false) const {
    const Value* v = doc_.Find(key);
    if (v == nullptr || v->is_null()) {
      return required ? Error(nullptr, key, "is missing") : absl::OkStatus();
    }
    if (!v->is_integer()) return Error(v, key, "must be an integer");
    if (v->as_int() < (positive ? 1 : 0)) {
      return Error(
          v, key,
          absl::StrCat("must be ", positive ? "positive" : "non-negative", ", not ", v->as_int()));
    }
    if (v->as_int() > kMaxConfigInt) {
      return Error(v, key,
                   absl::StrCat("is ", v->as_int(), "; at most ", kMaxConfigInt, " is supported"));
    }
    out = v->as_int();
    return absl::OkStatus();
  }

  // Int, at most `max` (`what` names the bound in the error).
  absl::Status IntAtMost(const std::string& key, int64_t& out, int64_t max, const char* what,
                         bool required = false, bool positive = false) const {
    RESHARD_RETURN_IF_ERROR(Int(key, out, required, positive));
    if (out > max) {
      return Error(doc_.Find(key), key,
                   absl::StrCat("is ", out, "; at most ", max, " ", what, " are supported"));
    }
    return absl::OkStatus();
  }

  absl::Status Bool(const std::string& key, bool& out) const {
    const Value* v = doc_.Find(key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_bool()) return Error(v, key, "must be true or false");
    out = v->as_bool();
    return absl::OkStatus();
  }

  absl::Status String(const std::string& key, std::string& out) const {
    const Value* v = doc_.Find(key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_string()) return Error(v, key, "must be a string");
    out = v->as_string();
    return absl::OkStatus();
  }

  absl::Status IntList(const std::string& key, std::vector<int64_t>& out) const {
    const Value* v = doc_.Find(key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_array()) return Error(v, key, "must be a list of integers");
    out.clear();
    for (const Value& item : v->items()) {
      if (!item.is_integer() || item.as_int() < 0) {
        return Error(&item, key, "must be a list of non-negative integers");
      }
      out.push_back(item.as_int());
    }
    return absl::OkStatus();
  }

 private:
  const Value& doc_;
  const std::string& origin_;
};

std::string LayerPrefix(int layer) { return absl::StrCat("layers.", layer, "."); }

class Expander {
 public:
  explicit Expander(std::vector<ModelParam>& out) : out_(out) {}

  void Add(std::string name, std::vector<int64_t> shape, ParamRole role, int layer,
           std::string fuse_group = "", int fuse_index = 0, std::string fused_name = "",
           bool kv_heads = false, int64_t expert = -1) {
    ModelParam p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.role = role;
    p.layer = layer;
    p.fuse_group = std::move(fuse_group);
    p.fuse_index = fuse_index;
    p.fused_name = std::move(fused_name);
    p.kv_heads = kv_heads;
    p.expert = expert;
    out_.push_back(std::move(p));
  }

  // gate/up/down of a SwiGLU MLP under `module` ("layers.3.mlp." or "...shared_experts.").
  void GatedMlp(const std::string& module, int64_t hidden, int64_t inter, bool bias, int layer) {
    const std::string fused = module + "gate_up_proj";
    Add(module + "gate_proj", {inter, hidden}, ParamRole::kColumnParallel, layer, "gate_up", 0,
        fused);
    Add(module + "up_proj", {inter, hidden}, ParamRole::kColumnParallel, layer, "gate_up", 1,
        fused);
    Add(module + "down_proj", {hidden, inter}, ParamRole::kRowParallel, layer);
    if (bias) {
      Add(module + "gate_proj.bias", {inter}, ParamRole::kColumnParallel, layer, "gate_up_bias", 0,
          fused + ".bias");
      Add(module + "up_proj.bias", {inter}, ParamRole::kColumnParallel, layer, "gate_up_bias", 1,
          fused + ".bias");
      Add(module + "down_proj.bias", {hidden}, ParamRole::kReplicated, layer);
    }
  }

 private:
  std::vector<ModelParam>& out_;
};

void ExpandAttention(const ModelConfig& c, int layer, Expander& x) {
  const std::string a = LayerPrefix(layer) + "self_attn.";
  const int64_t h = c.hidden_size;
  const int64_t nh = c.num_attention_heads;
  if (c.mla) {
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const int64_t kv_a_rows = c.kv_lora_rank + c.qk_rope_head_dim;
    if (c.q_lora_rank > 0) {
      // vLLM fuses the two replicated down-projections into fused_qkv_a_proj.
      const std::string fused = a + "fused_qkv_a_proj";
      x.Add(a + "q_a_proj", {c.q_lora_rank, h}, ParamRole::kReplicated, layer, "qkv_a", 0, fused);
      x.Add(a + "q_a_layernorm", {c.q_lora_rank}, ParamRole::kNorm, layer);
      x.Add(a + "q_b_proj", {nh * qk, c.q_lora_rank}, ParamRole::kColumnParallel, layer);
      x.Add(a + "kv_a_proj_with_mqa", {kv_a_rows, h}, ParamRole::kReplicated, layer, "qkv_a", 1,
            fused);
    } else {
      x.Add(a + "q_proj", {nh * qk, h}, ParamRole::kColumnParallel, layer);
      x.Add(a + "kv_a_proj_with_mqa", {kv_a_rows, h}, ParamRole::kReplicated, layer);
    }
    x.Add(a + "kv_a_layernorm", {c.kv_lora_rank}, ParamRole::kNorm, layer);
    x.Add(a + "kv_b_proj", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
          ParamRole::kColumnParallel, layer);
    x.Add(a + "o_proj", {h, nh * c.v_head_dim}, ParamRole::kRowParallel, layer);
    return;
  }
  const int64_t hd = c.head_dim;
  const int64_t kv = c.num_key_value_heads;
  const std::string fused = a + "qkv_proj";
  x.Add(a + "q_proj", {nh * hd, h}, ParamRole::kColumnParallel, layer, "qkv", 0, fused);
  x.Add(a + "k_proj", {kv * hd, h}, ParamRole::kColumnParallel, layer, "qkv", 1, fused, true);
  x.Add(a + "v_proj", {kv * hd, h}, ParamRole::kColumnParallel, layer, "qkv", 2, fused, true);
  if (c.attention_bias) {
    const std::string fb = fused + ".bias";
    x.Add(a + "q_proj.bias", {nh * hd}, ParamRole::kColumnParallel, layer, "qkv_bias", 0, fb);
    x.Add(a + "k_proj.bias", {kv * hd}, ParamRole::kColumnParallel, layer, "qkv_bias", 1, fb, true);
    x.Add(a + "v_proj.bias", {kv * hd}, ParamRole::kColumnParallel, layer, "qkv_bias", 2, fb, true);
  }
  x.Add(a + "o_proj", {h, nh * hd}, ParamRole::kRowParallel, layer);
  // Llama's attention_bias also covers o_proj; qwen2 has biases on q/k/v only.
  if (c.attention_bias && c.model_type == "llama") {
    x.Add(a + "o_proj.bias", {h}, ParamRole::kReplicated, layer);
  }
  if (c.qk_norm) {
    x.Add(a + "q_norm", {hd}, ParamRole::kNorm, layer);
    x.Add(a + "k_norm", {hd}, ParamRole::kNorm, layer);
  }
}

void ExpandMoe(const ModelConfig& c, int layer, ExpertTensors experts, Expander& x) {
  const std::string m = LayerPrefix(layer) + "mlp.";
  const int64_t h = c.hidden_size;
  const int64_t e = c.num_experts;
  const int64_t i = c.moe_intermediate_size;
  x.Add(m + "gate", {e, h}, ParamRole::kRouter, layer);
  if (c.router_bias) x.Add(m + "gate.e_score_correction_bias", {e}, ParamRole::kRouter, layer);
  const std::string w13 = m + "experts.w13_weight";
  const std::string w2 = m + "experts.down_proj";
  if (experts == ExpertTensors::kPerExpert) {
    const std::string prefix = m + "experts.";
    for (int64_t k = 0; k < e; ++k) {
      const std::string expert = absl::StrCat(prefix, k, ".");
      x.Add(expert + "gate_proj", {i, h}, ParamRole::kExpertColumn, layer, "w13", 0, w13, false, k);
      x.Add(expert + "up_proj", {i, h}, ParamRole::kExpertColumn, layer, "w13", 1, w13, false, k);
      x.Add(expert + "down_proj", {h, i}, ParamRole::kExpertRow, layer, "w2", 0, w2, false, k);
    }
  } else {
    x.Add(m + "experts.gate_proj", {e, i, h}, ParamRole::kExpertColumn, layer, "w13", 0, w13);
    x.Add(m + "experts.up_proj", {e, i, h}, ParamRole::kExpertColumn, layer, "w13", 1, w13);
    x.Add(w2, {e, h, i}, ParamRole::kExpertRow, layer);
  }
  if (c.n_shared_experts > 0) {
    x.GatedMlp(m + "shared_experts.", h, c.n_shared_experts * i, false, layer);
  }
}

}  // namespace

const char* ParamRoleName(ParamRole role) {
  switch (role) {
    case ParamRole::kEmbedding:
      return "embedding";
    case ParamRole::kLmHead:
      return "lm_head";
    case ParamRole::kNorm:
      return "norm";
    case ParamRole::kColumnParallel:
      return "column_parallel";
    case ParamRole::kRowParallel:
      return "row_parallel";
    case ParamRole::kRouter:
      return "router";
    case ParamRole::kExpertColumn:
      return "expert_column";
    case ParamRole::kExpertRow:
      return "expert_row";
    case ParamRole::kReplicated:
      return "replicated";
  }
  return "unknown";
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts == 0) return false;
  if (mla) {
    return layer >= first_k_dense_replace && moe_layer_freq > 0 && layer % moe_layer_freq == 0;
  }
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view text, const std::string& origin) {
  absl::StatusOr<Value> doc = json::Parse(text);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", doc.status().message()));
  }
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": a model config must be a JSON object"));
  }
  ConfigReader r(*doc, origin);
  ModelConfig c;
  RESHARD_RETURN_IF_ERROR(r.String("model_type", c.model_type));
  const std::string& t = c.model_type;
  const bool dense = t == "llama" || t == "qwen2" || t == "qwen3";
  const bool qwen_moe = t == "qwen3_moe";
  c.mla = t == "deepseek_v3" || t == "kimi_k2";
  if (!dense && !qwen_moe && !c.mla) {
    return r.Error(doc->Find("model_type"), "model_type",
                   absl::StrCat("\"", t,
                                "\" is not supported (supported: llama, qwen2, qwen3, "
                                "qwen3_moe, deepseek_v3, kimi_k2)"));
  }
  RESHARD_RETURN_IF_ERROR(r.Int("hidden_size", c.hidden_size, true, true));
  RESHARD_RETURN_IF_ERROR(r.IntAtMost("num_hidden_layers", c.num_hidden_layers, kMaxModelLayers,
                                      "decoder layers", true, true));
  RESHARD_RETURN_IF_ERROR(r.Int("num_attention_heads", c.num_attention_heads, true, true));
  RESHARD_RETURN_IF_ERROR(r.Int("vocab_size", c.vocab_size, true, true));
  c.num_key_value_heads = c.num_attention_heads;
  RESHARD_RETURN_IF_ERROR(r.Int("num_key_value_heads", c.num_key_value_heads, false, true));
  RESHARD_RETURN_IF_ERROR(r.Int("intermediate_size", c.intermediate_size));
  RESHARD_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", c.tie_word_embeddings));
  RESHARD_RETURN_IF_ERROR(r.String("torch_dtype", c.torch_dtype));
  if (c.torch_dtype.empty()) RESHARD_RETURN_IF_ERROR(r.String("dtype", c.torch_dtype));
  RESHARD_RETURN_IF_ERROR(r.Int("num_experts_per_tok", c.num_experts_per_tok));
  RESHARD_RETURN_IF_ERROR(r.Int("moe_intermediate_size", c.moe_intermediate_size));

  if (!c.mla) {
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
      return r.Error(doc->Find("num_key_value_heads"), "num_key_value_heads",
                     absl::StrCat("(", c.num_key_value_heads, ") must divide num_attention_heads (",
                                  c.num_attention_heads, ")"));
    }
    if (doc->Find("head_dim") != nullptr && !doc->Find("head_dim")->is_null()) {
      RESHARD_RETURN_IF_ERROR(r.Int("head_dim", c.head_dim, true, true));
    } else {
      if (c.hidden_size % c.num_attention_heads != 0) {
        return r.Error(nullptr, "head_dim",
                       "is missing and hidden_size is not a multiple of num_attention_heads");
      }
      c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    c.attention_bias = t == "qwen2";
    if (t != "qwen2") RESHARD_RETURN_IF_ERROR(r.Bool("attention_bias", c.attention_bias));
    if (t == "llama") RESHARD_RETURN_IF_ERROR(r.Bool("mlp_bias", c.mlp_bias));
    c.qk_norm = t == "qwen3" || t == "qwen3_moe";
  }
  if (qwen_moe) {
    RESHARD_RETURN_IF_ERROR(
        r.IntAtMost("num_experts", c.num_experts, kMaxModelExperts, "routed experts", true));
    RESHARD_RETURN_IF_ERROR(r.Int("decoder_sparse_step", c.decoder_sparse_step, false, true));
    RESHARD_RETURN_IF_ERROR(r.IntList("mlp_only_layers", c.mlp_only_layers));
  }
  if (c.mla) {
    RESHARD_RETURN_IF_ERROR(
        r.IntAtMost("n_routed_experts", c.num_experts, kMaxModelExperts, "routed experts"));
    RESHARD_RETURN_IF_ERROR(r.Int("n_shared_experts", c.n_shared_experts));
    RESHARD_RETURN_IF_ERROR(r.Int("first_k_dense_replace", c.first_k_dense_replace));
    RESHARD_RETURN_IF_ERROR(r.Int("moe_layer_freq", c.moe_layer_freq, false, true));
    RESHARD_RETURN_IF_ERROR(r.Int("q_lora_rank", c.q_lora_rank));
    RESHARD_RETURN_IF_ERROR(r.Int("kv_lora_rank", c.kv_lora_rank, true, true));
    RESHARD_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", c.qk_nope_head_dim, true, true));
    RESHARD_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", c.qk_rope_head_dim, true, true));
    RESHARD_RETURN_IF_ERROR(r.Int("v_head_dim", c.v_head_dim, true, true));
    // DeepSeek-V3 routing (noaux_tc) carries a per-expert score correction bias.
    std::string topk_method = "noaux_tc";
    RESHARD_RETURN_IF_ERROR(r.String("topk_method", topk_method));
    c.router_bias = topk_method == "noaux_tc";
  }
  bool any_dense = false, any_moe = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    (c.IsMoeLayer(l) ? any_moe : any_dense) = true;
  }
  if (any_dense && c.intermediate_size <= 0) {
    return r.Error(nullptr, "intermediate_size", "is missing (the model has dense MLP layers)");
  }
  if (any_moe && c.moe_intermediate_size <= 0) {
    return r.Error(nullptr, "moe_intermediate_size", "is missing (the model has MoE layers)");
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the model config"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseModelConfig(buffer.str(), path);
}

bool HasRoutedExperts(const ModelConfig& c) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) return true;
  }
  return false;
}

std::vector<ModelParam> ExpandModel(const ModelConfig& c, ExpertTensors experts) {
  std::vector<ModelParam> params;
  Expander x(params);
  const int64_t h = c.hidden_size;
  x.Add("embed_tokens", {c.vocab_size, h}, ParamRole::kEmbedding, -1);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = LayerPrefix(layer);
    x.Add(p + "input_layernorm", {h}, ParamRole::kNorm, layer);
    ExpandAttention(c, layer, x);
    x.Add(p + "post_attention_layernorm", {h}, ParamRole::kNorm, layer);
    if (c.IsMoeLayer(layer)) {
      ExpandMoe(c, layer, experts, x);
    } else {
      x.GatedMlp(p + "mlp.", h, c.intermediate_size, c.mlp_bias, layer);
    }
  }
  x.Add("norm", {h}, ParamRole::kNorm, -1);
  if (!c.tie_word_embeddings) x.Add("lm_head", {c.vocab_size, h}, ParamRole::kLmHead, -1);
  return params;
}

int64_t TotalParameters(const std::vector<ModelParam>& params) {
  int64_t total = 0;
  for (const ModelParam& p : params) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    total += n;
  }
  return total;
}

}  // namespace reshard::plan
