// An in-memory store shared by the ranks (or threads) of one process, through the public
// store callbacks: what the API unit tests use where no other process takes part.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "reshard/reshard.h"

namespace reshard::testing {

struct MemoryStore {
  std::mutex mu;
  std::map<std::string, std::string> kv;
  reshard::StoreCallbacks Callbacks() {
    reshard::StoreCallbacks cb;
    cb.set = [this](const std::string& k, const std::string& v) {
      std::lock_guard<std::mutex> lock(mu);
      kv[k] = v;
      return absl::OkStatus();
    };
    cb.get = [this](const std::string& k, absl::Time deadline) -> absl::StatusOr<std::string> {
      while (true) {
        {
          std::lock_guard<std::mutex> lock(mu);
          auto it = kv.find(k);
          if (it != kv.end()) return it->second;
        }
        if (absl::Now() > deadline) return absl::DeadlineExceededError("no key " + k);
        absl::SleepFor(absl::Milliseconds(1));
      }
    };
    cb.list = [this](const std::string& prefix)
        -> absl::StatusOr<std::vector<std::pair<std::string, std::string>>> {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<std::pair<std::string, std::string>> out;
      for (auto it = kv.lower_bound(prefix); it != kv.end() && it->first.rfind(prefix, 0) == 0;
           ++it) {
        out.push_back(*it);
      }
      return out;
    };
    return cb;
  }
};

}  // namespace reshard::testing
