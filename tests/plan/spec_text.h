// Shared by the plan tests that write specs as JSON text.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"

namespace reshard::plan {

// A 2-D mesh as JSON: `replicas` rows of `size` consecutive ranks, the first row from `first`
// ("[[8, 9], [10, 11]]" for 2, 2, 8).
inline std::string ReplicaMesh(int replicas, int size, int first) {
  std::string mesh;
  for (int r = 0; r < replicas; ++r) {
    absl::StrAppend(&mesh, r ? ", " : "", "[");
    for (int t = 0; t < size; ++t) absl::StrAppend(&mesh, t ? ", " : "", first + size * r + t);
    absl::StrAppend(&mesh, "]");
  }
  return absl::StrCat("[", mesh, "]");
}

// Two trainers, three destination domains of two ranks: "a" goes to every domain (the later ones
// by relays between destination domains), "b" to the first only.
constexpr char kRelaySpec[] =
    R"json({"topology": {"domains": [[0, 1], [2, 3], [4, 5], [6, 7]]}, "tensors": [
  {"name": "a", "dtype": "fp32", "shape": [512, 2048], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
  {"name": "b", "dtype": "fp32", "shape": [512, 2048], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

}  // namespace reshard::plan
