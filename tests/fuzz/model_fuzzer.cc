// Fuzzes what turns a Hugging Face config.json into a refit spec (`reshard spec|sim|bench
// --model`): the config and cluster readers, the parallelism parsers, ExpandModel and
// MakeModelSpec (docs/layouts.md), then plans and verifies the specs small enough.
//
// Input: a line with a cluster file's JSON (empty: domains of 4 GPUs, the default bandwidths), a
// line of trainer parallelism ("tp=2,pp=2,ep=2,gpus=8"), a line of inference parallelism
// ("tp=2,dp=2"), then the config's JSON text. A hash of the input picks stacked or per-expert
// tensors and the plan options.
// Properties checked (a violation aborts, which is a finding):
// - every refusal (config, cluster, parallelism, MakeModelSpec, Validate) is InvalidArgument in
//   one line of at most 2 KiB, and nothing crashes (UBSan: no overflow on any field within the
//   bounds of model.h);
// - ExpandModel names every parameter once;
// - a spec MakeModelSpec returns round-trips through SpecToJson, and one that validates and is
//   within the budget (64 ranks, 256 tensors, 32 MiB bounded as tests/fuzz/spec_budget.h does)
//   plans, and the plan verifies in one process.
// Budget: ExpandModel runs only on configs of at most 16 layers and 64 experts (expanding is
// linear in them; the bounds themselves are tested in tests/plan/model_test.cc), and
// MakeModelSpec only for at most 64 GPUs on each side. FUZZ_MODEL_VERBOSE=1 prints how far each
// input got.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/checked.h"
#include "src/common/hash.h"
#include "src/plan/cluster.h"
#include "src/plan/executor.h"
#include "src/plan/layouts.h"
#include "src/plan/model.h"
#include "src/plan/plan.h"
#include "src/plan/spec.h"
#include "src/plan/spec_json.h"
#include "tests/fuzz/spec_budget.h"

namespace reshard::plan {
namespace {

constexpr SpecBudget kBudget{64, 256, int64_t{32} << 20};
constexpr int64_t kMaxLayers = 16;
constexpr int64_t kMaxExperts = 64;
constexpr int64_t kMaxGpus = 64;
constexpr size_t kMaxErrorBytes = 2048;

void Check(bool ok, std::string_view what, std::string_view detail) {
  if (!ok) {
    fprintf(stderr, "fuzz_model: %.*s\n%.*s\n", static_cast<int>(what.size()), what.data(),
            static_cast<int>(detail.size()), detail.data());
    std::abort();
  }
}

// A refusal: InvalidArgument, one bounded line.
void CheckRefusal(const absl::Status& status, std::string_view what) {
  const std::string message(status.message());
  Check(absl::IsInvalidArgument(status), std::string(what) + ": not InvalidArgument",
        status.ToString());
  Check(message.find('\n') == std::string::npos, std::string(what) + ": not one line", message);
  Check(message.size() <= kMaxErrorBytes, std::string(what) + ": longer than 2 KiB", message);
}

// The next line of `text` from `at` (without its newline); `at` moves past it.
std::string_view Line(std::string_view text, size_t& at) {
  const size_t end = std::min(text.find('\n', at), text.size());
  const std::string_view line = text.substr(at, end - at);
  at = std::min(end + 1, text.size());
  return line;
}

ClusterDesc FuzzCluster() {
  ClusterDesc c;
  c.name = "fuzz";
  c.gpus_per_node = 4;
  c.gpus_per_domain = 4;
  return c;
}

int64_t TrainGpus(const TrainParallelism& t) {
  if (t.gpus > 0) return t.gpus;
  int64_t n = SaturatingMul(SaturatingMul(t.tp, t.cp), t.pp);
  return SaturatingMul(n, std::max<int64_t>(t.dp, 1));
}

// FUZZ_MODEL_VERBOSE set: how far each input got.
void Say(const char* what, const std::string& detail = "") {
  static const bool verbose = std::getenv("FUZZ_MODEL_VERBOSE") != nullptr;
  if (verbose)
    fprintf(stderr, "fuzz_model: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
}

void Run(std::string_view text) {
  size_t at = 0;
  const std::string_view cluster_text = Line(text, at);
  const std::string train_text(Line(text, at));
  const std::string infer_text(Line(text, at));
  const std::string_view config = text.substr(at);
  const uint64_t h = HashBytes(text.data(), text.size(), 0);

  absl::StatusOr<ClusterDesc> cluster = FuzzCluster();
  if (!cluster_text.empty()) cluster = ParseClusterJson(cluster_text);
  if (!cluster.ok()) {
    Say("refused by ParseClusterJson", cluster.status().ToString());
    return CheckRefusal(cluster.status(), "ParseClusterJson");
  }
  absl::StatusOr<ModelConfig> cfg = ParseModelConfig(config, "config");
  if (!cfg.ok()) {
    Say("refused by ParseModelConfig", cfg.status().ToString());
    return CheckRefusal(cfg.status(), "ParseModelConfig");
  }
  absl::StatusOr<TrainParallelism> train = ParseTrainParallelism(train_text);
  if (!train.ok()) {
    Say("refused by ParseTrainParallelism", train.status().ToString());
    return CheckRefusal(train.status(), "ParseTrainParallelism");
  }
  absl::StatusOr<InferParallelism> infer = ParseInferParallelism(infer_text);
  if (!infer.ok()) {
    Say("refused by ParseInferParallelism", infer.status().ToString());
    return CheckRefusal(infer.status(), "ParseInferParallelism");
  }
  if (cfg->num_hidden_layers > kMaxLayers || cfg->num_experts > kMaxExperts) {
    return Say("parsed; too large to expand");
  }

  const ExpertTensors experts =
      (h & 1) != 0 && HasRoutedExperts(*cfg) ? ExpertTensors::kPerExpert : ExpertTensors::kStacked;
  absl::flat_hash_set<std::string> names;
  for (const ModelParam& p : ExpandModel(*cfg, experts)) {
    Check(names.insert(p.name).second, "ExpandModel names a parameter twice", p.name);
  }
  if (TrainGpus(*train) > kMaxGpus ||
      SaturatingMul(SaturatingMul(infer->tp, infer->dp), infer->ep) > kMaxGpus) {
    return Say("expanded; too many GPUs to lay out");
  }
  ModelSpecOptions opts;
  opts.experts = experts;
  absl::StatusOr<RefitSpec> made = MakeModelSpec(*cfg, *train, *infer, *cluster, opts);
  if (!made.ok()) {
    Say("refused by MakeModelSpec", made.status().ToString());
    return CheckRefusal(made.status(), "MakeModelSpec");
  }
  const std::string written = SpecToJson(*made);
  absl::StatusOr<RefitSpec> reparsed = ParseSpecJson(written);
  const absl::Status valid = Validate(*made);
  if (!valid.ok()) {
    Say("refused by Validate", valid.ToString());
    return CheckRefusal(valid, "Validate");
  }
  Check(reparsed.ok(), "a valid spec that MakeModelSpec made does not parse back",
        reparsed.ok() ? written : reparsed.status().ToString());
  if (!WithinBudget(*made, kBudget)) {
    return Say("valid; too large to plan", std::to_string(made->tensors.size()) + " tensors, " +
                                               std::to_string(made->WorldSize()) + " ranks");
  }
  PlanOptions plan_options;
  plan_options.relay = (h & 2) != 0;
  plan_options.staging = (h & 4) != 0;
  absl::StatusOr<Plan> plan =
      BuildPlan(std::make_shared<const RefitSpec>(*std::move(made)), plan_options);
  Check(plan.ok(), "a valid model spec does not plan", plan.status().ToString() + "\n" + written);
  const absl::Status verified = VerifyPlanInProcess(*plan, int64_t{64} << 20);
  Check(verified.ok(), "the plan of a model spec does not verify",
        verified.ToString() + "\n" + written);
  Say("planned and verified", std::to_string(plan->transfers().size()) + " transfers");
}

}  // namespace
}  // namespace reshard::plan

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reshard::plan::Run(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
