// The options of the commands that expand a Hugging Face model into a refit spec (`reshard
// spec`, `reshard sim`, `reshard bench --model`), parsed once for all of them:
//   --model M.json --train P --infer P [--cluster C.json] [--dtype T] [--layers N] [--per-expert]
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "src/plan/cluster.h"
#include "src/plan/spec.h"
#include "tools/reshard/args.h"

namespace reshard::cli {

// Options taking a value, and flags, for Args::Parse; a command adds its own to these.
std::set<std::string> ModelOptions();
std::set<std::string> ModelFlags();

// Help lines of the options above (one per option, aligned like the commands' help texts).
extern const char kModelOptionsHelp[];

// Without --cluster: an error (`reshard sim`), or one NVLink domain per inference TP group, the
// processes of one host standing in for GPUs (`reshard spec`, `reshard bench`).
enum class ClusterDefault { kRequired, kDomainPerInferenceTp };

struct ModelSpec {
  plan::RefitSpec spec;
  plan::ClusterDesc cluster;
};

// The spec of --model under --train and --infer (plan::MakeModelSpec): --dtype (default bf16),
// --layers N keeps the first N decoder layers, --per-expert names every routed expert's matrices
// (ExpertTensors::kPerExpert; an error for a model without routed experts). Errors are one
// sentence: a missing option, an unreadable or unsupported model or cluster, a parallelism that
// does not fit the model (InvalidArgument or NotFound).
[[nodiscard]] absl::StatusOr<ModelSpec> ModelSpecFromArgs(const Args& args,
                                                          ClusterDefault cluster_default);

// A quantization scheme as --infer-quant and --dst-quant take it: block:AxB (default 128x128),
// mx[:N], channel, tensor. InvalidArgument naming `flag` otherwise.
[[nodiscard]] absl::StatusOr<plan::Quant> ParseQuantOption(const std::string& text,
                                                           const std::string& flag);
// An FP8 dtype as --infer-dtype and --dst-dtype take it.
[[nodiscard]] absl::StatusOr<plan::DType> ParseFp8Option(const std::string& text,
                                                         const std::string& flag);

}  // namespace reshard::cli
