#include "src/plan/cluster.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "src/common/json.h"
#include "src/plan/spec.h"

namespace reshard::plan {
namespace {

using json::Value;

absl::Status Error(const Value& at, const std::string& key, const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat(at.Where(), ": cluster key \"", key, "\" ", message));
}

// GPUs per node or domain: at most the largest refit world (spec.h).
absl::Status ReadCount(const Value& v, const std::string& key, int64_t& out) {
  if (!v.is_integer()) return Error(v, key, "must be an integer");
  if (v.as_int() < 1) return Error(v, key, absl::StrCat("must be positive, not ", v.as_int()));
  if (v.as_int() > kMaxWorldSize) {
    return Error(v, key,
                 absl::StrCat("is ", v.as_int(), "; at most ", kMaxWorldSize,
                              " GPUs (the largest refit world) are supported"));
  }
  out = v.as_int();
  return absl::OkStatus();
}

absl::Status ReadBandwidth(const Value& v, const std::string& key, double& out) {
  if (!v.is_number()) return Error(v, key, "must be a number");
  if (!(v.as_double() > 0)) return Error(v, key, "must be positive");
  if (!BandwidthInRange(v.as_double())) return Error(v, key, BandwidthRangeError(v.as_double()));
  out = v.as_double();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterDesc> ParseClusterJson(std::string_view text) {
  absl::StatusOr<Value> doc = json::Parse(text);
  if (!doc.ok()) return doc.status();
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(doc->Where(), ": a cluster description must be a JSON object"));
  }
  ClusterDesc c;
  for (const auto& [key, value] : doc->members()) {
    absl::Status s;
    if (key == "name" || key == "notes") {
      if (!value.is_string()) s = Error(value, key, "must be a string");
      if (key == "name" && s.ok()) c.name = value.as_string();
    } else if (key == "gpus_per_node") {
      s = ReadCount(value, key, c.gpus_per_node);
    } else if (key == "gpus_per_domain") {
      s = ReadCount(value, key, c.gpus_per_domain);
    } else if (key == "nic_gbytes_per_s") {
      s = ReadBandwidth(value, key, c.nic_gbytes_per_s);
    } else if (key == "nvlink_gbytes_per_s") {
      s = ReadBandwidth(value, key, c.nvlink_gbytes_per_s);
    } else {
      s = Error(value, key,
                "is unknown (allowed: name, gpus_per_node, gpus_per_domain, nic_gbytes_per_s, "
                "nvlink_gbytes_per_s, notes)");
    }
    if (!s.ok()) return s;
  }
  return c;
}

absl::StatusOr<ClusterDesc> LoadClusterFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the cluster file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto cluster = ParseClusterJson(buffer.str());
  if (!cluster.ok()) {
    return absl::Status(cluster.status().code(),
                        absl::StrCat(path, ": ", cluster.status().message()));
  }
  if (cluster->name.empty()) cluster->name = path;
  return cluster;
}

}  // namespace reshard::plan
