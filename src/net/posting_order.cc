#include "src/net/posting_order.h"

#include <algorithm>

namespace reshard::net {

std::vector<uint32_t> PostingOrder(const SendProgram& p, const std::vector<bool>& selected,
                                   bool local_copies) {
  std::vector<int32_t> peers = p.peers;
  if (!peers.empty()) {
    std::rotate(peers.begin(), peers.begin() + p.rank % static_cast<int32_t>(peers.size()),
                peers.end());
  }
  // Each link's queue: its initial descriptors, in the index's order.
  std::vector<std::vector<uint32_t>> queues(peers.size());
  std::vector<int32_t> link_of(p.peer_begin.size(), -1);  // By rank.
  for (size_t l = 0; l < peers.size(); ++l) link_of[peers[l]] = static_cast<int32_t>(l);
  for (uint32_t di : p.dependencies.initial()) {
    const int32_t l = link_of[p.descs[di].peer];
    if (p.descs[di].peer != p.rank && l >= 0) queues[l].push_back(di);
  }
  // Sweeps over the links, one descriptor per link per sweep; while relay feeds are left, a
  // link whose next descriptor is not one skips its turn (each queue lists its feeds first).
  int64_t feeds_left = 0;
  for (const std::vector<uint32_t>& q : queues) {
    for (uint32_t di : q) feeds_left += p.descs[di].relay_feed ? 1 : 0;
  }
  // As PostSends: a sweep in which no feed could go lets the others go.
  std::vector<uint32_t> order;
  std::vector<size_t> next(queues.size(), 0);
  bool feeds_only = feeds_left > 0;
  for (bool any = true; any;) {
    any = false;
    for (size_t l = 0; l < queues.size(); ++l) {
      const std::vector<uint32_t>& q = queues[l];
      if (next[l] >= q.size()) continue;
      const uint32_t di = q[next[l]];
      if (feeds_only && !p.descs[di].relay_feed) continue;
      ++next[l];
      if (p.descs[di].relay_feed && --feeds_left == 0) feeds_only = false;
      if (selected[di]) order.push_back(di);
      any = true;
    }
    if (!any && feeds_only) {
      feeds_only = false;
      any = true;
    }
  }
  if (local_copies) {
    for (uint32_t di : p.dependencies.initial()) {
      if (p.descs[di].peer == p.rank && selected[di]) order.push_back(di);
    }
  }
  return order;
}

}  // namespace reshard::net
