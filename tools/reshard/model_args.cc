#include "tools/reshard/model_args.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/common/status.h"
#include "src/plan/layouts.h"
#include "src/plan/model.h"

namespace reshard::cli {

std::set<std::string> ModelOptions() {
  return {"model", "train", "infer", "cluster", "dtype", "layers", "infer-dtype", "infer-quant"};
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
  --infer-dtype T    store the inference matrices as T (fp8e4m3 or fp8e5m2), quantized by the
                     source so only FP8 bytes and scales travel (docs/quantization.md); the
                     embedding, lm_head and router stay in --dtype, as do matrices whose tiles
                     would cut a block (the spec's comment counts them)
  --infer-quant Q    with --infer-dtype: block:AxB (default block:128x128), mx[:N] (E8M0 per N
                     elements, default 32), channel or tensor
  --per-expert       one tensor per routed expert matrix with Hugging Face names
                     (layers.N.mlp.experts.K.gate_proj [I, H], up_proj [I, H], down_proj [H, I])
                     instead of one [E, ...] stack per layer and projection; each is a view into
                     the same inference buffer as the stack; an error for a dense model
)";

// "block:128x128", "block:128", "mx", "mx:32", "channel", "tensor".
absl::StatusOr<plan::Quant> ParseQuantOption(const std::string& text, const std::string& flag) {
  const std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  plan::Quant q;
  const std::string& scheme = parts[0];
  if (scheme == "block") {
    q.scheme = plan::QuantScheme::kBlock;
  } else if (scheme == "mx") {
    q.scheme = plan::QuantScheme::kMx;
  } else if (scheme == "channel") {
    q.scheme = plan::QuantScheme::kChannel;
  } else if (scheme == "tensor") {
    q.scheme = plan::QuantScheme::kTensor;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " \"", text, "\": the scheme is block, mx, channel or tensor"));
  }
  if (parts.size() > 1) {
    if (q.scheme != plan::QuantScheme::kBlock && q.scheme != plan::QuantScheme::kMx) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " \"", text, "\": ", scheme, " takes no block"));
    }
    for (absl::string_view e : absl::StrSplit(parts[1], 'x')) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(e, &v) || v < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, " \"", text, "\": a block is positive extents joined by x (128x128)"));
      }
      q.block.push_back(v);
    }
  } else if (q.scheme == plan::QuantScheme::kBlock) {
    q.block = {128, 128};
  }
  return q;
}

absl::StatusOr<plan::DType> ParseFp8Option(const std::string& text, const std::string& flag) {
  auto d = plan::ParseDType(text);
  if (!d || (*d != plan::DType::kFp8E4M3 && *d != plan::DType::kFp8E5M2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " \"", text, "\" is not fp8e4m3 or fp8e5m2"));
  }
  return *d;
}

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
  if (auto fp8 = args.Get("infer-dtype")) {
    RESHARD_ASSIGN_OR_RETURN(opts.infer_dtype, ParseFp8Option(*fp8, "infer-dtype"));
  }
  if (auto q = args.Get("infer-quant")) {
    if (!opts.infer_dtype) return absl::InvalidArgumentError("--infer-quant needs --infer-dtype");
    RESHARD_ASSIGN_OR_RETURN(opts.infer_quant, ParseQuantOption(*q, "infer-quant"));
  }
  RESHARD_ASSIGN_OR_RETURN(out.spec, plan::MakeModelSpec(cfg, train, infer, out.cluster, opts));
  return out;
}

}  // namespace reshard::cli
