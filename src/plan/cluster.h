// Hardware descriptions for the simulator and for spec generation (DESIGN §8).
//
// A cluster file (shared/clusters/*.json, examples/clusters/*.json) gives GPUs per node and per
// NVLink domain and per-GPU, per-direction NIC and NVLink bandwidths:
//   {"name": "DGX H100", "gpus_per_node": 8, "gpus_per_domain": 8,
//    "nic_gbytes_per_s": 50, "nvlink_gbytes_per_s": 450, "notes": "free text"}
// Every numeric key is optional (defaults below); "name" and "notes" are free text; any other key
// is an error so that a typo cannot pass silently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace reshard::plan {

struct ClusterDesc {
  std::string name;
  int64_t gpus_per_node = 8;
  int64_t gpus_per_domain = 8;       // GPUs sharing one NVLink domain (NVL8 node, NVL72 rack).
  double nic_gbytes_per_s = 50;      // Per GPU, per direction.
  double nvlink_gbytes_per_s = 450;  // Per GPU, per direction.
};

// Parses a cluster description. Errors are InvalidArgument naming the line, column and key:
// unknown keys, wrong types, non-positive counts or bandwidths.
[[nodiscard]] absl::StatusOr<ClusterDesc> ParseClusterJson(std::string_view text);
// Reads and parses a file; the path is named in every error (NotFound when it cannot be read).
[[nodiscard]] absl::StatusOr<ClusterDesc> LoadClusterFile(const std::string& path);

}  // namespace reshard::plan
