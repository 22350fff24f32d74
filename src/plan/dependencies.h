// The one reading of a transfer's `after` (plan.h): a transfer with after >= 0 may start on its
// sender only once transfer `after` has landed on that sender in the same epoch; one with
// after < 0 may start as soon as the epoch starts (and its receiver granted it). The network
// engine (send descriptors) and the fan-out layer (fan-out edges) both index their work with
// this type, so the rule lives in one place.
//
// Items are whatever the user indexes (descriptor or edge numbers); Add them, then Finish.
// Thread-compatible; immutable after Finish().
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace reshard::plan {

class DependencyIndex {
 public:
  // Registers `item`, which waits for transfer `after` (after < 0: waits for nothing).
  void Add(int32_t after, uint32_t item) {
    if (after < 0) {
      initial_.push_back(item);
    } else {
      waiting_.push_back({static_cast<uint32_t>(after), item});
    }
    finished_ = false;
  }
  // Sorts the index; call once after the last Add (items keep their Add order per transfer).
  void Finish() {
    std::stable_sort(waiting_.begin(), waiting_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    items_.resize(waiting_.size());
    for (size_t i = 0; i < waiting_.size(); ++i) items_[i] = waiting_[i].second;
    finished_ = true;
  }

  // Items that may start when the epoch starts, in Add order.
  absl::Span<const uint32_t> initial() const { return initial_; }
  // Items that may start once `transfer` landed, in Add order.
  absl::Span<const uint32_t> WaitingOn(uint32_t transfer) const {
    auto lo = std::lower_bound(waiting_.begin(), waiting_.end(), transfer,
                               [](const auto& p, uint32_t t) { return p.first < t; });
    auto hi = std::upper_bound(lo, waiting_.end(), transfer,
                               [](uint32_t t, const auto& p) { return t < p.first; });
    return absl::Span<const uint32_t>(items_.data() + (lo - waiting_.begin()),
                                      static_cast<size_t>(hi - lo));
  }
  bool finished() const { return finished_; }

 private:
  std::vector<uint32_t> initial_;
  std::vector<std::pair<uint32_t, uint32_t>> waiting_;  // (after transfer, item), sorted.
  std::vector<uint32_t> items_;                         // waiting_[i].second, contiguous.
  bool finished_ = true;
};

}  // namespace reshard::plan
