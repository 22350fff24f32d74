// Hugging Face configs expand to the published parameter counts, and cluster files parse.
#include "src/plan/model.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/container/flat_hash_set.h"
#include "src/plan/cluster.h"

namespace reshard::plan {
namespace {

std::string ExamplePath(const std::string& rel) {
  return std::string(RESHARD_SOURCE_DIR) + "/examples/" + rel;
}

ModelConfig Load(const std::string& file) {
  auto cfg = LoadModelConfig(ExamplePath("models/" + file));
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : ModelConfig{};
}

const ModelParam* Find(const std::vector<ModelParam>& params, const std::string& name) {
  for (const ModelParam& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

struct Published {
  const char* file;
  double billions;  // Published size.
  int64_t exact;    // What the expansion gives (pinned so changes are deliberate).
};

class TotalsTest : public ::testing::TestWithParam<Published> {};

TEST_P(TotalsTest, MatchesPublishedSizeWithinHalfAPercent) {
  const Published& pub = GetParam();
  const std::vector<ModelParam> params = ExpandModel(Load(pub.file));
  const int64_t total = TotalParameters(params);
  EXPECT_NEAR(static_cast<double>(total) / 1e9, pub.billions, pub.billions * 0.005) << pub.file;
  EXPECT_EQ(total, pub.exact) << pub.file;
  absl::flat_hash_set<std::string> names;
  for (const ModelParam& p : params) EXPECT_TRUE(names.insert(p.name).second) << p.name;
}

INSTANTIATE_TEST_SUITE_P(Models, TotalsTest,
                         ::testing::Values(Published{"qwen3-235b-a22b.json", 235.1, 235093634560},
                                           Published{"deepseek-v3.json", 671.0, 671026419200},
                                           Published{"kimi-k2.json", 1030.0, 1026408232448},
                                           Published{"qwen3-32b.json", 32.8, 32762123264},
                                           Published{"qwen3-30b-a3b.json", 30.5, 30532122624}),
                         [](const auto& info) {
                           std::string name = info.param.file;
                           name = name.substr(0, name.find(".json"));
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(ModelTest, DeepSeekV3HasMlaDenseFirstLayersSharedAndStackedExperts) {
  const ModelConfig cfg = Load("deepseek-v3.json");
  EXPECT_TRUE(cfg.mla);
  EXPECT_EQ(cfg.num_experts, 256);
  const std::vector<ModelParam> params = ExpandModel(cfg);
  // Dense layers 0..2, MoE from layer 3.
  ASSERT_NE(Find(params, "layers.2.mlp.gate_proj"), nullptr);
  EXPECT_EQ(Find(params, "layers.3.mlp.gate_proj"), nullptr);
  const ModelParam* w1 = Find(params, "layers.3.mlp.experts.gate_proj");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->shape, (std::vector<int64_t>{256, 2048, 7168}));
  EXPECT_EQ(w1->role, ParamRole::kExpertColumn);
  EXPECT_EQ(w1->fuse_group, "w13");
  EXPECT_EQ(w1->fused_name, "layers.3.mlp.experts.w13_weight");
  const ModelParam* w2 = Find(params, "layers.60.mlp.experts.down_proj");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->shape, (std::vector<int64_t>{256, 7168, 2048}));
  EXPECT_EQ(w2->role, ParamRole::kExpertRow);
  ASSERT_NE(Find(params, "layers.3.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(Find(params, "layers.3.mlp.shared_experts.up_proj")->shape,
            (std::vector<int64_t>{2048, 7168}));
  EXPECT_EQ(Find(params, "layers.0.self_attn.q_b_proj")->shape,
            (std::vector<int64_t>{128 * 192, 1536}));
  EXPECT_EQ(Find(params, "layers.0.self_attn.kv_a_proj_with_mqa")->shape,
            (std::vector<int64_t>{576, 7168}));
  EXPECT_EQ(Find(params, "layers.0.self_attn.kv_b_proj")->shape,
            (std::vector<int64_t>{128 * 256, 512}));
  EXPECT_EQ(Find(params, "layers.0.self_attn.o_proj")->shape,
            (std::vector<int64_t>{7168, 128 * 128}));
  EXPECT_EQ(Find(params, "layers.61.input_layernorm"), nullptr);  // No MTP layer.
  ASSERT_NE(Find(params, "lm_head"), nullptr);
}

// Per-expert expansion (Hugging Face checkpoint names): every routed expert's three matrices in
// place of the three stacks, in expert order, and nothing else changes.
TEST(ModelTest, PerExpertNamesEveryExpertMatrixLikeHuggingFace) {
  const ModelConfig cfg = Load("tiny-moe.json");  // 5 layers, layer 0 dense, 8 experts, I 24.
  const std::vector<ModelParam> stacked = ExpandModel(cfg);
  const std::vector<ModelParam> per_expert = ExpandModel(cfg, ExpertTensors::kPerExpert);
  EXPECT_EQ(stacked.size(), 62u);
  EXPECT_EQ(per_expert.size(), 146u);  // 4 MoE layers x (8 experts x 3 - 3 stacks) more.
  EXPECT_EQ(TotalParameters(per_expert), TotalParameters(stacked));
  EXPECT_EQ(Find(per_expert, "layers.1.mlp.experts.gate_proj"), nullptr);
  EXPECT_EQ(Find(per_expert, "layers.0.mlp.experts.0.gate_proj"), nullptr);  // Dense layer.
  // Layer 3's MoE block: router, then gate, up, down of expert 0, 1, ..., 7.
  size_t router = 0;
  while (router < per_expert.size() && per_expert[router].name != "layers.3.mlp.gate") ++router;
  ASSERT_LT(router + 24, per_expert.size());
  for (int64_t k = 0; k < 8; ++k) {
    const std::string prefix = "layers.3.mlp.experts." + std::to_string(k) + ".";
    const ModelParam& gate = per_expert[router + 1 + 3 * k];
    const ModelParam& up = per_expert[router + 2 + 3 * k];
    const ModelParam& down = per_expert[router + 3 + 3 * k];
    EXPECT_EQ(gate.name, prefix + "gate_proj");
    EXPECT_EQ(up.name, prefix + "up_proj");
    EXPECT_EQ(down.name, prefix + "down_proj");
    EXPECT_EQ(gate.shape, (std::vector<int64_t>{24, 64}));
    EXPECT_EQ(up.shape, (std::vector<int64_t>{24, 64}));
    EXPECT_EQ(down.shape, (std::vector<int64_t>{64, 24}));
    for (const ModelParam* p : {&gate, &up, &down}) {
      EXPECT_EQ(p->expert, k) << p->name;
      EXPECT_EQ(p->layer, 3) << p->name;
    }
    EXPECT_EQ(gate.role, ParamRole::kExpertColumn);
    EXPECT_EQ(up.role, ParamRole::kExpertColumn);
    EXPECT_EQ(down.role, ParamRole::kExpertRow);
    EXPECT_EQ(gate.fused_name, "layers.3.mlp.experts.w13_weight");
    EXPECT_EQ(gate.fuse_index, 0);
    EXPECT_EQ(up.fused_name, "layers.3.mlp.experts.w13_weight");
    EXPECT_EQ(up.fuse_index, 1);
    EXPECT_EQ(down.fused_name, "layers.3.mlp.experts.down_proj");
  }
  EXPECT_EQ(per_expert[router + 25].name, "layers.4.input_layernorm");
  for (const ModelParam& p : stacked) EXPECT_EQ(p.expert, -1) << p.name;
  EXPECT_TRUE(HasRoutedExperts(cfg));
  // A dense model expands the same either way.
  const ModelConfig dense = Load("qwen3-32b.json");
  EXPECT_FALSE(HasRoutedExperts(dense));
  EXPECT_EQ(ExpandModel(dense, ExpertTensors::kPerExpert).size(), ExpandModel(dense).size());
}

TEST(ModelTest, DeepSeekV3PerExpertHasAbout45kTensors) {
  const ModelConfig cfg = Load("deepseek-v3.json");
  const std::vector<ModelParam> stacked = ExpandModel(cfg);
  const std::vector<ModelParam> per_expert = ExpandModel(cfg, ExpertTensors::kPerExpert);
  // 58 MoE layers x (256 experts x 3 matrices - 3 stacks) more than the 1,025 stacked tensors.
  EXPECT_EQ(stacked.size(), 1025u);
  EXPECT_EQ(per_expert.size(), 1025u + 58u * (256u * 3u - 3u));
  EXPECT_EQ(TotalParameters(per_expert), 671026419200);
  const ModelParam* down = Find(per_expert, "layers.60.mlp.experts.255.down_proj");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{7168, 2048}));
  EXPECT_EQ(Find(per_expert, "layers.2.mlp.experts.0.up_proj"), nullptr);
  absl::flat_hash_set<std::string> names;
  for (const ModelParam& p : per_expert) EXPECT_TRUE(names.insert(p.name).second) << p.name;
}

TEST(ModelTest, MlaWithoutQLoraUsesQProj) {
  auto cfg = ParseModelConfig(R"({"model_type": "deepseek_v3", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
      "v_head_dim": 8, "vocab_size": 100, "n_routed_experts": null})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::vector<ModelParam> params = ExpandModel(*cfg);
  EXPECT_EQ(Find(params, "layers.0.self_attn.q_a_proj"), nullptr);
  ASSERT_NE(Find(params, "layers.0.self_attn.q_proj"), nullptr);
  EXPECT_EQ(Find(params, "layers.0.self_attn.q_proj")->shape, (std::vector<int64_t>{48, 64}));
  EXPECT_TRUE(Find(params, "layers.0.self_attn.kv_a_proj_with_mqa")->fused_name.empty());
}

TEST(ModelTest, Qwen3HasQkNormAndFusedQkv) {
  const std::vector<ModelParam> params = ExpandModel(Load("qwen3-32b.json"));
  EXPECT_EQ(Find(params, "layers.7.self_attn.q_norm")->shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(Find(params, "layers.7.self_attn.k_norm")->role, ParamRole::kNorm);
  const ModelParam* k = Find(params, "layers.7.self_attn.k_proj");
  EXPECT_EQ(k->shape, (std::vector<int64_t>{8 * 128, 5120}));
  EXPECT_TRUE(k->kv_heads);
  EXPECT_EQ(k->fuse_group, "qkv");
  EXPECT_EQ(k->fuse_index, 1);
  EXPECT_EQ(k->fused_name, "layers.7.self_attn.qkv_proj");
  EXPECT_EQ(Find(params, "layers.7.mlp.up_proj")->fused_name, "layers.7.mlp.gate_up_proj");
}

TEST(ModelTest, Qwen2HasQkvBiasAndTiedEmbeddings) {
  auto cfg = ParseModelConfig(R"({"model_type": "qwen2", "hidden_size": 896,
      "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
      "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::vector<ModelParam> params = ExpandModel(*cfg);
  EXPECT_EQ(Find(params, "lm_head"), nullptr);
  EXPECT_EQ(Find(params, "layers.0.self_attn.v_proj.bias")->fused_name,
            "layers.0.self_attn.qkv_proj.bias");
  EXPECT_EQ(Find(params, "layers.0.self_attn.o_proj.bias"), nullptr);
  // Qwen2-0.5B: 494 M parameters.
  EXPECT_NEAR(static_cast<double>(TotalParameters(params)) / 1e6, 494.0, 494.0 * 0.005);
}

TEST(ModelTest, LlamaDefaultsHeadDim) {
  auto cfg = ParseModelConfig(R"({"model_type": "llama", "hidden_size": 4096,
      "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "vocab_size": 128256})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->head_dim, 128);
  // Llama-3-8B: 8.03 B parameters.
  EXPECT_NEAR(static_cast<double>(TotalParameters(ExpandModel(*cfg))) / 1e9, 8.03, 8.03 * 0.005);
}

TEST(ModelTest, ConfigErrorsNameTheField) {
  auto unsupported = ParseModelConfig(R"({"model_type": "gpt2", "hidden_size": 8})");
  EXPECT_EQ(unsupported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(unsupported.status().message()).find("gpt2"), std::string::npos);
  auto missing = ParseModelConfig(R"({"model_type": "qwen3", "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10})");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(missing.status().message()).find("intermediate_size"), std::string::npos);
  auto wrong_type = ParseModelConfig(R"({"model_type": "qwen3", "hidden_size": "8"})");
  EXPECT_NE(std::string(wrong_type.status().message()).find("hidden_size"), std::string::npos);
  EXPECT_EQ(LoadModelConfig("/nonexistent/config.json").status().code(),
            absl::StatusCode::kNotFound);
}

// A mistyped or hostile config is refused in one sentence naming the field and the bound, before
// anything is expanded (a billion layers used to expand until memory ran out).
TEST(ModelTest, ConfigIntegersAreBounded) {
  const std::string base = R"({"model_type": "qwen3_moe", "hidden_size": 64,
      "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128,
      "moe_intermediate_size": 32, "num_experts_per_tok": 2, )";
  struct Case {
    std::string fields, field, bound;
  };
  const Case cases[] = {
      {R"("num_hidden_layers": 1000000000, "num_experts": 8)", "num_hidden_layers", "1024"},
      {R"("num_hidden_layers": 2, "num_experts": 100000)", "num_experts", "8192"},
      {R"("num_hidden_layers": 2, "num_experts": 8, "head_dim": 1099511627776)", "head_dim",
       "1073741824"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    auto cfg = ParseModelConfig(base + c.fields + "}");
    ASSERT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << cfg.status();
    const std::string message(cfg.status().message());
    EXPECT_NE(message.find("\"" + c.field + "\""), std::string::npos) << message;
    EXPECT_NE(message.find("at most " + c.bound), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  auto mla = ParseModelConfig(R"({"model_type": "deepseek_v3", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
      "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 9000,
      "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8})");
  ASSERT_EQ(mla.status().code(), absl::StatusCode::kInvalidArgument) << mla.status();
  EXPECT_NE(mla.status().message().find("\"n_routed_experts\" is 9000; at most 8192"),
            std::string::npos)
      << mla.status();
  // At the bounds a config parses.
  auto edge = ParseModelConfig(base + R"("num_hidden_layers": 1024, "num_experts": 8192})");
  EXPECT_TRUE(edge.ok()) << edge.status();
}

TEST(ClusterTest, LoadsBothExampleClusters) {
  auto h100 = LoadClusterFile(ExamplePath("clusters/h100-nvl8.json"));
  ASSERT_TRUE(h100.ok()) << h100.status();
  EXPECT_EQ(h100->gpus_per_node, 8);
  EXPECT_EQ(h100->gpus_per_domain, 8);
  EXPECT_EQ(h100->nic_gbytes_per_s, 50);
  EXPECT_EQ(h100->nvlink_gbytes_per_s, 450);
  auto gb200 = LoadClusterFile(ExamplePath("clusters/gb200-nvl72.json"));
  ASSERT_TRUE(gb200.ok()) << gb200.status();
  EXPECT_EQ(gb200->gpus_per_node, 4);
  EXPECT_EQ(gb200->gpus_per_domain, 72);
  EXPECT_EQ(gb200->nvlink_gbytes_per_s, 900);
}

TEST(ClusterTest, UnknownKeysAndBadValuesAreErrors) {
  auto typo = ParseClusterJson(R"({"name": "x", "gpus_per_domian": 8})");
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(typo.status().message()).find("gpus_per_domian"), std::string::npos);
  EXPECT_FALSE(ParseClusterJson(R"({"gpus_per_node": 0})").ok());
  EXPECT_FALSE(ParseClusterJson(R"({"nic_gbytes_per_s": -1})").ok());
  EXPECT_FALSE(ParseClusterJson(R"({"gpus_per_node": 2.5})").ok());
  EXPECT_FALSE(ParseClusterJson("[]").ok());
  EXPECT_TRUE(ParseClusterJson(R"({"notes": "only defaults"})").ok());
  // Typos far outside any cluster are refused naming the key and the bound.
  struct Case {
    const char* json;
    const char* says;
  };
  for (const Case& c : {
           Case{R"({"gpus_per_domain": 1099511627776})",
                "\"gpus_per_domain\" is 1099511627776; at most 65536 GPUs"},
           Case{R"({"nic_gbytes_per_s": 1e308})",
                "\"nic_gbytes_per_s\" is 1e+308; it must lie in [0.001, 1e+06] GB/s"},
           Case{R"({"nvlink_gbytes_per_s": 1e-308})",
                "\"nvlink_gbytes_per_s\" is 1e-308; it must lie in [0.001, 1e+06] GB/s"},
       }) {
    auto parsed = ParseClusterJson(c.json);
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(parsed.status().message().find(c.says), std::string::npos) << parsed.status();
  }
  EXPECT_TRUE(ParseClusterJson(R"({"nic_gbytes_per_s": 0.001, "nvlink_gbytes_per_s": 1e6})").ok());
}

}  // namespace
}  // namespace reshard::plan
