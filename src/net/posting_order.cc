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
  std::vector<uint32_t> order;
  for (size_t round = 0;; ++round) {
    bool any = false;
    for (const std::vector<uint32_t>& q : queues) {
      if (round >= q.size()) continue;
      any = true;
      if (selected[q[round]]) order.push_back(q[round]);
    }
    if (!any) break;
  }
  if (local_copies) {
    for (uint32_t di : p.dependencies.initial()) {
      if (p.descs[di].peer == p.rank && selected[di]) order.push_back(di);
    }
  }
  return order;
}

}  // namespace reshard::net
