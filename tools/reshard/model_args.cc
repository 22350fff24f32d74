#include "tools/reshard/model_args.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"
#include "src/plan/layouts.h"
#include "src/plan/model.h"

namespace reshard::cli {

std::set<std::string> ModelOptions() {
  return {"model", "train", "infer", "cluster", "dtype", "layers"};
}

std::set<std::string> ModelFlags() { return {"per-expert"}; }

const char kModelOptionsHelp[] =
    R"(  --model M.json     Hugging Face config.json (llama, qwen2, qwen3, qwen3_moe, deepseek_v3,
                     kimi_k2); docs/layouts.md has the layouts generated from it
  --train P          trainer parallelism, e.g. tp=4,pp=8,ep=16[,cp=..][,dp=..][,etp=..][,gpus=N]
                     (Megatron, rank order tp-cp-ep-dp-pp)
  --infer P          inference parallelism, e.g. tp=8,dp=16[,ep=..] (vLLM)
  --dtype T          weight dtype of the model (default bf16)
  --layers N         keep only the first N decoder layers
  --per-expert       one tensor per routed expert matrix with Hugging Face names
                     (layers.N.mlp.experts.K.gate_proj [I, H], up_proj [I, H], down_proj [H, I])
                     instead of one [E, ...] stack per layer and projection; each is a view into
                     the same inference buffer as the stack; an error for a dense model
)";

absl::StatusOr<ModelSpec> ModelSpecFromArgs(const Args& args, ClusterDefault cluster_default) {
  const auto model_path = args.Get("model");
  const auto train_text = args.Get("train");
  const auto infer_text = args.Get("infer");
  if (!model_path || !train_text || !infer_text) {
    return absl::InvalidArgumentError("needs --model M.json, --train P and --infer P (see --help)");
  }
  const auto cluster_path = args.Get("cluster");
  if (!cluster_path && cluster_default == ClusterDefault::kRequired) {
    return absl::InvalidArgumentError("needs --cluster C.json with --model (see --help)");
  }
  RESHARD_ASSIGN_OR_RETURN(plan::ModelConfig cfg, plan::LoadModelConfig(*model_path));
  if (args.Has("layers")) {
    auto layers = args.GetInt("layers", 0);
    if (!layers.ok() || *layers < 1) {
      return absl::InvalidArgumentError("--layers must be a positive integer");
    }
    cfg.num_hidden_layers = std::min(cfg.num_hidden_layers, *layers);
    cfg.first_k_dense_replace = std::min(cfg.first_k_dense_replace, *layers);
  }
  RESHARD_ASSIGN_OR_RETURN(plan::TrainParallelism train, plan::ParseTrainParallelism(*train_text));
  RESHARD_ASSIGN_OR_RETURN(plan::InferParallelism infer, plan::ParseInferParallelism(*infer_text));
  ModelSpec out;
  if (cluster_path) {
    RESHARD_ASSIGN_OR_RETURN(out.cluster, plan::LoadClusterFile(*cluster_path));
  } else {
    out.cluster.name = "one NVLink domain per inference TP group";
    out.cluster.gpus_per_domain = out.cluster.gpus_per_node = infer.tp;
  }
  plan::ModelSpecOptions opts;
  if (auto dtype = args.Get("dtype")) {
    auto d = plan::ParseDType(*dtype);
    if (!d) return absl::InvalidArgumentError(absl::StrCat("--dtype \"", *dtype, "\" is unknown"));
    opts.dtype = *d;
  }
  if (args.Has("per-expert")) opts.experts = plan::ExpertTensors::kPerExpert;
  RESHARD_ASSIGN_OR_RETURN(out.spec, plan::MakeModelSpec(cfg, train, infer, out.cluster, opts));
  return out;
}

}  // namespace reshard::cli
