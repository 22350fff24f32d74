// Prints how long expanding a model and generating its refit spec takes for the issue-3 rows,
// with stacked and with per-expert tensors, how long Validate() takes on the result and how
// long writing it as JSON (what `reshard spec` prints) takes. Figures only; never fails on speed.
//
//   model_spec_bench [examples dir]   (default: the source tree's examples/)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "src/plan/layouts.h"
#include "src/plan/spec_json.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace reshard::plan;
  const std::string dir = argc > 1 ? argv[1] : std::string(RESHARD_SOURCE_DIR) + "/examples";
  struct Row {
    const char* model;
    const char* cluster;
    const char* train;
    const char* infer;
  };
  const std::vector<Row> rows = {
      {"qwen3-235b-a22b", "h100-nvl8", "tp=4,pp=8,ep=16,gpus=128", "tp=8,dp=16"},
      {"deepseek-v3", "h100-nvl8", "pp=16,ep=16,gpus=256", "tp=32,dp=8"},
      {"deepseek-v3", "gb200-nvl72", "pp=16,ep=16,gpus=256", "tp=32,dp=8"},
      {"kimi-k2", "h100-nvl8", "pp=16,ep=16,gpus=256", "tp=16,dp=8"},
  };
  std::printf("%-16s %-12s %-26s %-12s %-10s %8s %10s %10s %10s %10s %9s\n", "model", "cluster",
              "train", "infer", "experts", "tensors", "params", "spec_s", "validate_s", "json_s",
              "json_MB");
  for (const Row& r : rows) {
    for (const ExpertTensors experts : {ExpertTensors::kStacked, ExpertTensors::kPerExpert}) {
      auto cfg = LoadModelConfig(dir + "/models/" + r.model + ".json");
      auto cluster = LoadClusterFile(dir + "/clusters/" + r.cluster + ".json");
      auto train = ParseTrainParallelism(r.train);
      auto infer = ParseInferParallelism(r.infer);
      if (!cfg.ok() || !cluster.ok() || !train.ok() || !infer.ok()) {
        std::fprintf(stderr, "cannot load row %s: %s %s\n", r.model,
                     std::string(cfg.status().message()).c_str(),
                     std::string(cluster.status().message()).c_str());
        return 1;
      }
      const auto start = std::chrono::steady_clock::now();
      ModelSpecOptions opts;
      opts.experts = experts;
      auto spec = MakeModelSpec(*cfg, *train, *infer, *cluster, opts);
      const double spec_s = Seconds(start);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s: %s\n", r.model, std::string(spec.status().message()).c_str());
        return 1;
      }
      const auto vstart = std::chrono::steady_clock::now();
      const absl::Status valid = Validate(*spec);
      const double validate_s = Seconds(vstart);
      if (!valid.ok()) {
        std::fprintf(stderr, "%s: %s\n", r.model, std::string(valid.message()).c_str());
        return 1;
      }
      const auto jstart = std::chrono::steady_clock::now();
      const std::string json = SpecToJson(*spec);
      const double json_s = Seconds(jstart);
      std::printf("%-16s %-12s %-26s %-12s %-10s %8zu %9.1fB %10.4f %10.4f %10.4f %9.1f\n", r.model,
                  r.cluster, r.train, r.infer,
                  experts == ExpertTensors::kStacked ? "stacked" : "per-expert",
                  spec->tensors.size(),
                  static_cast<double>(TotalParameters(ExpandModel(*cfg))) / 1e9, spec_s, validate_s,
                  json_s, static_cast<double>(json.size()) / 1e6);
    }
  }
  return 0;
}
