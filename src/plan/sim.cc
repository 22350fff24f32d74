#include "src/plan/sim.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "src/common/delta_codec.h"
#include "src/common/status.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {

uint64_t FlowKey(int32_t from, int32_t to, int32_t stage, bool nvlink) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 42) |
         (static_cast<uint64_t>(static_cast<uint32_t>(to)) << 20) |
         (static_cast<uint64_t>(std::min(stage, 0x7ffff)) << 1) | (nvlink ? 1u : 0u);
}

class FlowAggregator {
 public:
  void Add(int32_t from, int32_t to, int32_t stage, bool nvlink, int64_t bytes,
           bool feeds_relay = false, bool after_feed = false) {
    if (bytes <= 0 || from == to) return;
    const uint8_t kind = (feeds_relay ? 2 : 0) | (after_feed ? 1 : 0);
    auto [it, inserted] =
        index_.try_emplace(std::make_pair(FlowKey(from, to, stage, nvlink), kind), flows_.size());
    if (inserted) flows_.push_back({from, to, stage, nvlink, 0, feeds_relay, after_feed});
    flows_[it->second].bytes += bytes;
  }
  std::vector<Flow> Take() { return std::move(flows_); }

 private:
  absl::flat_hash_map<std::pair<uint64_t, uint8_t>, size_t> index_;
  std::vector<Flow> flows_;
};

}  // namespace

namespace {

// The world plan's transfers as flows, each carrying bytes_of(transfer) bytes; a transfer's
// stage is one after the one it waits for.
template <typename BytesOf>
std::vector<Flow> FlowsOf(const Plan& plan, bool by_relay_feed, BytesOf&& bytes_of) {
  RESHARD_CHECK(plan.rank() < 0);  // Flows of the whole world: a rank's share lacks the rest.
  FlowAggregator agg;
  const auto& transfers = plan.transfers();
  std::vector<int32_t> stage(transfers.size(), 0);
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& tr = transfers[i];
    stage[i] = tr.after < 0 ? 0 : stage[tr.after] + 1;
    if (tr.kind == TransferKind::kLocal) continue;
    agg.Add(tr.from_rank, tr.to_rank, stage[i], tr.kind == TransferKind::kFanout, bytes_of(tr),
            by_relay_feed && tr.feeds_relay,
            by_relay_feed && tr.after >= 0 && transfers[tr.after].feeds_relay);
  }
  return agg.Take();
}

}  // namespace

std::vector<Flow> FlowsFromPlan(const Plan& plan, bool by_relay_feed) {
  return FlowsOf(plan, by_relay_feed,
                 [&](const Transfer& tr) { return plan.region(tr.region).bytes; });
}

double DeltaBytesRatio(double fraction, int elem_bytes) {
  const double f = std::clamp(fraction, 0.0, 1.0);
  const double es = static_cast<double>(elem_bytes);
  const double bitmap = 1.0 / (8.0 * es) + f;
  // Scattered changes: an element starts a run when it changed and its predecessor did not.
  const double runs = f + 4.0 * f * (1.0 - f) / es;
  const double table = 4.0 / (static_cast<double>(delta::kChunkElems) * es);
  // Every segment's stream has a header, also when it falls back to the plain segment.
  const double header = static_cast<double>(sizeof(delta::StreamHeader)) /
                        static_cast<double>(delta::kSegmentBytes);
  return std::min(1.0, std::min(bitmap, runs) + table) + header;
}

std::vector<Flow> DeltaFlowsFromPlan(const Plan& plan, double fraction,
                                     const DeltaFlowOptions& options) {
  return FlowsOf(plan, options.by_relay_feed, [&](const Transfer& tr) {
    const int64_t bytes = plan.region(tr.region).bytes;
    const int es = DeltaElemBytes(plan, tr);
    return es == 0
               ? bytes
               : static_cast<int64_t>(static_cast<double>(bytes) * DeltaBytesRatio(fraction, es));
  });
}

DeltaMemory DeltaMemoryOf(const Plan& plan) {
  const auto world = static_cast<size_t>(plan.world_size());
  std::vector<int64_t> shadow(world, 0), scratch(world, 0), landing(world, 0);
  DeltaMemory m;
  for (const Transfer& t : plan.transfers()) {
    const int es = DeltaElemBytes(plan, t);
    if (es == 0) continue;
    const int64_t bytes = plan.region(t.region).bytes;
    const int64_t capacity = delta::PieceCapacity(bytes / es, es);
    if (!IsRelay(t)) shadow[static_cast<size_t>(t.from_rank)] += bytes;
    scratch[static_cast<size_t>(t.from_rank)] += capacity;
    landing[static_cast<size_t>(t.to_rank)] += capacity;
  }
  auto largest = [](const std::vector<int64_t>& v, int64_t* max, int32_t* rank, int64_t* total) {
    for (size_t r = 0; r < v.size(); ++r) {
      *total += v[r];
      if (v[r] > *max) {
        *max = v[r];
        *rank = static_cast<int32_t>(r);
      }
    }
  };
  largest(shadow, &m.max_shadow_bytes, &m.max_shadow_rank, &m.shadow_bytes);
  largest(scratch, &m.max_send_scratch_bytes, &m.max_send_scratch_rank, &m.send_scratch_bytes);
  largest(landing, &m.max_landing_bytes, &m.max_landing_rank, &m.landing_bytes);
  return m;
}

std::vector<Flow> GatherBroadcastFlows(const RefitSpec& spec, const DomainMap& domains) {
  std::vector<Flow> all;
  for (std::vector<Flow>& stage : GatherBroadcastStages(spec, domains)) {
    all.insert(all.end(), stage.begin(), stage.end());
  }
  return all;
}

std::vector<std::vector<Flow>> GatherBroadcastStages(const RefitSpec& spec,
                                                     const DomainMap& domains) {
  std::vector<FlowAggregator> aggs;
  // Gather ranks in ascending order with the bytes each broadcasts.
  std::vector<std::pair<int32_t, int64_t>> gathered;
  absl::flat_hash_map<int32_t, size_t> gather_index;
  std::vector<bool> is_dst(domains.world_size(), false);
  for (const TensorSpec& ts : spec.tensors) {
    for (int32_t r : ts.dst.mesh.ranks) is_dst[r] = true;
    const int32_t g = *std::min_element(ts.src.mesh.ranks.begin(), ts.src.mesh.ranks.end());
    int64_t elements = 1;
    for (int64_t s : ts.shape) elements *= s;
    auto [it, inserted] = gather_index.try_emplace(g, gathered.size());
    if (inserted) {
      gathered.push_back({g, 0});
      aggs.emplace_back();
    }
    gathered[it->second].second += elements * DTypeSize(ts.dtype);
    TileGrid grid(ts.src, ts.shape);
    for (int64_t flat = 0; flat < grid.num_cells(); ++flat) {
      const TileGrid::Cell cell = grid.CellAt(flat);
      const int32_t holder = grid.Holder(cell, 0);
      aggs[it->second].Add(holder, g, 0, domains.domain_of(holder) == domains.domain_of(g),
                           grid.CellBox(cell).NumElements() * DTypeSize(ts.dtype));
    }
  }
  // Ascending gather ranks.
  std::vector<size_t> by_rank(gathered.size());
  for (size_t i = 0; i < by_rank.size(); ++i) by_rank[i] = i;
  std::sort(by_rank.begin(), by_rank.end(),
            [&](size_t a, size_t b) { return gathered[a].first < gathered[b].first; });
  // Destination ranks per domain.
  std::vector<std::vector<int32_t>> dst_domains;
  for (int32_t d = 0; d < domains.num_domains(); ++d) {
    std::vector<int32_t> ranks;
    for (int32_t r : domains.ranks(d)) {
      if (is_dst[r]) ranks.push_back(r);
    }
    if (!ranks.empty()) dst_domains.push_back(std::move(ranks));
  }
  std::vector<std::vector<Flow>> out;
  for (size_t i = 0; i < by_rank.size(); ++i) {
    const auto [g, bytes] = gathered[by_rank[i]];
    // The chain: one flow through every hop (it streams behind the gathering at g, stage 1).
    Flow chain{g, g, 1, false, bytes};
    int32_t prev = g;
    const size_t nd = dst_domains.size();
    for (size_t k = 0; k < nd; ++k) {
      const auto& ranks = dst_domains[(i + k) % nd];
      for (size_t j = 0; j < ranks.size(); ++j) {
        const int32_t r = ranks[(i + j) % ranks.size()];
        if (r == prev) continue;
        chain.via.push_back({r, domains.domain_of(prev) == domains.domain_of(r)});
        prev = r;
      }
    }
    std::vector<Flow> flows = aggs[by_rank[i]].Take();
    if (!chain.via.empty() && bytes > 0) {
      chain.to = prev;
      flows.push_back(std::move(chain));
    }
    out.push_back(std::move(flows));
  }
  return out;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Calls fn(from, to, nvlink) for each hop of `f`: one, or a chain's (Flow::via).
template <typename Fn>
void ForEachHop(const Flow& f, Fn&& fn) {
  if (f.via.empty()) {
    fn(f.from, f.to, f.nvlink);
    return;
  }
  int32_t prev = f.from;
  for (const auto& [rank, nvlink] : f.via) {
    fn(prev, rank, nvlink);
    prev = rank;
  }
}

class Simulator {
 public:
  Simulator(const std::vector<Flow>& flows, int32_t world, const Topology& topo,
            const SimOptions& options)
      : flows_(flows), options_(options) {
    const double nic = topo.nic_gbytes_per_s * 1e9, nvlink = topo.nvlink_gbytes_per_s * 1e9;
    capacity_.resize(4 * static_cast<size_t>(world));
    for (int32_t r = 0; r < world; ++r) {
      capacity_[4 * r + 0] = nic;
      capacity_[4 * r + 1] = nic;
      capacity_[4 * r + 2] = nvlink;
      capacity_[4 * r + 3] = nvlink;
    }
    const size_t n = flows.size();
    order_.resize(n);
    for (size_t i = 0; i < n; ++i) order_[i] = static_cast<uint32_t>(i);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](uint32_t a, uint32_t b) { return flows[a].stage < flows[b].stage; });
    // Groups: arrivals at (rank, stage, relay feed or not).
    absl::flat_hash_map<uint64_t, int32_t> group_ids;
    auto key = [](int32_t rank, int32_t stage, bool feed) {
      return (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32) |
             (static_cast<uint64_t>(static_cast<uint32_t>(stage)) << 1) | (feed ? 1u : 0u);
    };
    own_group_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      auto [it, inserted] =
          group_ids.try_emplace(key(flows[i].to, flows[i].stage, flows[i].feeds_relay),
                                static_cast<int32_t>(group_total_.size()));
      if (inserted) group_total_.push_back(0);
      own_group_[i] = it->second;
      group_total_[own_group_[i]] += static_cast<double>(flows[i].bytes);
    }
    parent_group_.assign(n, -1);
    for (size_t i = 0; i < n; ++i) {
      if (flows[i].stage == 0) continue;
      auto it = group_ids.find(key(flows[i].from, flows[i].stage - 1, flows[i].after_feed));
      if (it != group_ids.end()) parent_group_[i] = it->second;
    }
    // Relay priority (a what-if: the engine shares fairly): relay feeds weigh more on both of
    // their links.
    weight_.assign(n, 1.0);
    for (size_t i = 0; i < n; ++i) {
      if (flows[i].feeds_relay && !flows[i].nvlink) weight_[i] = options.relay_feed_weight;
    }
    group_sent_.assign(group_total_.size(), 0);
    int32_t max_stage = 0;
    for (const Flow& f : flows) max_stage = std::max(max_stage, f.stage);
    max_iterations_ = std::min(max_stage + 2, 400);
    inflow_.assign(group_total_.size(), 0);
    // Each flow's links: its sender's egress and receiver's ingress, NIC or NVLink; a chain's
    // those of every hop.
    flow_link_begin_.assign(n + 1, 0);
    flow_links_.clear();
    flow_links_.reserve(2 * n);
    for (size_t i = 0; i < n; ++i) {
      ForEachHop(flows[i], [&](int32_t from, int32_t to, bool nvlink) {
        const uint32_t base = nvlink ? 2 : 0;
        flow_links_.push_back(4 * static_cast<uint32_t>(from) + base);
        flow_links_.push_back(4 * static_cast<uint32_t>(to) + base + 1);
      });
      flow_link_begin_[i + 1] = static_cast<uint32_t>(flow_links_.size());
    }
    sent_.assign(n, 0);
    rate_.assign(n, 0);
    cap_.assign(n, kInf);
    done_.assign(n, 0);
    for (size_t i = 0; i < n; ++i) done_[i] = flows[i].bytes <= 0;
    BuildLinkLists();
  }

  // Flows per link (CSR) over the flows not done yet.
  void BuildLinkLists() {
    link_begin_.assign(capacity_.size() + 1, 0);
    listed_ = 0;
    for (size_t i = 0; i < flows_.size(); ++i) {
      if (done_[i]) continue;
      for (uint32_t k = flow_link_begin_[i]; k < flow_link_begin_[i + 1]; ++k) {
        ++link_begin_[flow_links_[k] + 1];
      }
      ++listed_;
    }
    for (size_t l = 0; l < capacity_.size(); ++l) link_begin_[l + 1] += link_begin_[l];
    link_flows_.resize(link_begin_.back());
    std::vector<uint32_t> next(link_begin_.begin(), link_begin_.end() - 1);
    for (size_t i = 0; i < flows_.size(); ++i) {
      if (done_[i]) continue;
      for (uint32_t k = flow_link_begin_[i]; k < flow_link_begin_[i + 1]; ++k) {
        link_flows_[next[flow_links_[k]]++] = static_cast<uint32_t>(i);
      }
    }
  }

  SimResult Run() {
    SimResult result;
    result.flows = static_cast<int64_t>(flows_.size());
    result.finished.assign(flows_.size(), 0.0);
    const size_t n = flows_.size();
    double now = 0;
    size_t active = 0;
    for (size_t i = 0; i < n; ++i) active += !done_[i];
    while (active > 0) {
      ++result.events;
      if (active * 2 < listed_) BuildLinkLists();
      // Rates: max-min fair with availability caps, iterated so that caps follow parent rates.
      // Caps follow the parents' rates: iterate until they settle (chains need one round per
      // hop); without caps one filling is exact.
      for (int iter = 0; iter < max_iterations_; ++iter) {
        bool changed = false;
        for (size_t i = 0; i < n; ++i) {
          double cap = kInf;
          if (!done_[i] && parent_group_[i] >= 0) {
            const int32_t g = parent_group_[i];
            const double bytes = static_cast<double>(flows_[i].bytes);
            const double avail = Available(i);
            if (avail < bytes && sent_[i] >= avail - Tolerance(i)) {
              cap = bytes * inflow_[g] / group_total_[g];
            }
          }
          if (!(std::abs(cap - cap_[i]) <= 1e-9 * std::max(1.0, cap)) &&
              !(cap == kInf && cap_[i] == kInf)) {
            changed = true;
          }
          cap_[i] = cap;
        }
        if (iter > 0 && !changed) break;
        Fill();
        std::fill(inflow_.begin(), inflow_.end(), 0.0);
        for (size_t i = 0; i < n; ++i) {
          if (!done_[i]) inflow_[own_group_[i]] += rate_[i];
        }
      }
      // Next events: completions and dependent flows catching up with their data.
      std::vector<double> when(n, kInf);
      double first = kInf;
      for (size_t i = 0; i < n; ++i) {
        if (done_[i] || rate_[i] <= 0) continue;
        const double bytes = static_cast<double>(flows_[i].bytes);
        double t = (bytes - sent_[i]) / rate_[i];
        if (parent_group_[i] >= 0) {
          const int32_t g = parent_group_[i];
          const double avail = Available(i);
          const double avail_rate = bytes * inflow_[g] / group_total_[g];
          if (avail < bytes && rate_[i] > avail_rate * (1 + 1e-9) &&
              sent_[i] < avail - Tolerance(i)) {
            t = std::min(t, (avail - sent_[i]) / (rate_[i] - avail_rate));
          }
        }
        when[i] = t;
        first = std::min(first, t);
      }
      // Stages strictly increase along dependencies, so some flow can always move.
      RESHARD_CHECK_MSG(first < kInf, "simulation stalled with flows left");
      const double window = first + options_.batch_fraction * (now + first);
      double step = first;
      for (size_t i = 0; i < n; ++i) {
        if (when[i] <= window) step = std::max(step, when[i]);
      }
      // Advance in stage order so a dependent flow sees its parents' new arrivals.
      for (uint32_t i : order_) {
        if (done_[i]) continue;
        const double bytes = static_cast<double>(flows_[i].bytes);
        double s = std::min(bytes, sent_[i] + rate_[i] * step);
        if (rate_[i] > 0 && (bytes - sent_[i]) / rate_[i] <= step * (1 + 1e-12)) s = bytes;
        if (parent_group_[i] >= 0) s = std::min(s, std::max(sent_[i], Available(i)));
        group_sent_[own_group_[i]] += s - sent_[i];
        sent_[i] = s;
        if (s >= bytes - Tolerance(i)) {
          group_sent_[own_group_[i]] += bytes - s;
          sent_[i] = bytes;
          done_[i] = 1;
          rate_[i] = 0;
          --active;
          result.finished[i] = now + step;
        }
      }
      now += step;
    }
    result.seconds = now;
    result.nic_in.assign(capacity_.size() / 4, 0);
    result.nic_out.assign(capacity_.size() / 4, 0);
    for (const Flow& f : flows_) {
      ForEachHop(f, [&](int32_t from, int32_t to, bool nvlink) {
        if (nvlink) {
          result.nvlink_bytes += f.bytes;
        } else {
          result.network_bytes += f.bytes;
          result.nic_out[from] += f.bytes;
          result.nic_in[to] += f.bytes;
        }
      });
    }
    for (size_t r = 0; r < result.nic_in.size(); ++r) {
      result.max_nic_bytes = std::max({result.max_nic_bytes, result.nic_in[r], result.nic_out[r]});
    }
    return result;
  }

 private:
  double Tolerance(size_t i) const { return 1e-9 * static_cast<double>(flows_[i].bytes) + 1e-3; }

  double Available(size_t i) const {
    const double bytes = static_cast<double>(flows_[i].bytes);
    const int32_t g = parent_group_[i];
    if (g < 0 || group_total_[g] <= 0) return bytes;
    return std::min(bytes, bytes * group_sent_[g] / group_total_[g] * (1 + 1e-12));
  }

  // Indexed binary min-heap of links by fair share; shares only grow while filling.
  void HeapSwap(size_t a, size_t b) {
    std::swap(heap_[a], heap_[b]);
    heap_pos_[heap_[a]] = static_cast<int32_t>(a);
    heap_pos_[heap_[b]] = static_cast<int32_t>(b);
  }
  bool HeapLess(size_t a, size_t b) const {
    const double ka = share_[heap_[a]], kb = share_[heap_[b]];
    return ka < kb || (ka == kb && heap_[a] < heap_[b]);
  }
  void SiftDown(size_t i) {
    const size_t n = heap_.size();
    while (true) {
      size_t m = i;
      const size_t l = 2 * i + 1, r = l + 1;
      if (l < n && HeapLess(l, m)) m = l;
      if (r < n && HeapLess(r, m)) m = r;
      if (m == i) return;
      HeapSwap(i, m);
      i = m;
    }
  }
  void SiftUp(size_t i) {
    while (i > 0 && HeapLess(i, (i - 1) / 2)) {
      HeapSwap(i, (i - 1) / 2);
      i = (i - 1) / 2;
    }
  }
  void HeapRemove(uint32_t link) {
    const int32_t p = heap_pos_[link];
    if (p < 0) return;
    const size_t last = heap_.size() - 1;
    if (static_cast<size_t>(p) != last) HeapSwap(p, last);
    heap_.pop_back();
    heap_pos_[link] = -1;
    if (static_cast<size_t>(p) < heap_.size()) {
      SiftDown(p);
      SiftUp(p);
    }
  }

  // Progressive filling: repeatedly saturate the link (or flow cap) with the smallest fair share.
  void Fill() {
    const size_t n = flows_.size();
    const size_t links = capacity_.size();
    remaining_.assign(capacity_.begin(), capacity_.end());
    count_.assign(links, 0.0);
    live_.assign(links, 0);
    share_.assign(links, kInf);
    heap_pos_.assign(links, -1);
    heap_.clear();
    fixed_.assign(n, 0);
    capped_.clear();
    for (size_t i = 0; i < n; ++i) {
      rate_[i] = 0;
      if (done_[i]) {
        fixed_[i] = 1;
        continue;
      }
      for (uint32_t k = flow_link_begin_[i]; k < flow_link_begin_[i + 1]; ++k) {
        count_[flow_links_[k]] += weight_[i];
        live_[flow_links_[k]]++;
      }
      if (cap_[i] < kInf) capped_.push_back({cap_[i] / weight_[i], static_cast<uint32_t>(i)});
    }
    std::sort(capped_.begin(), capped_.end());
    for (size_t l = 0; l < links; ++l) {
      if (live_[l] == 0) continue;
      share_[l] = remaining_[l] / count_[l];
      heap_pos_[l] = static_cast<int32_t>(heap_.size());
      heap_.push_back(static_cast<uint32_t>(l));
    }
    for (size_t i = heap_.size(); i-- > 0;) SiftDown(i);
    auto fix = [&](size_t i, double rate, uint32_t skip) {
      rate_[i] = std::max(0.0, rate);
      fixed_[i] = 1;
      for (uint32_t k = flow_link_begin_[i]; k < flow_link_begin_[i + 1]; ++k) {
        const uint32_t l = flow_links_[k];
        if (l == skip) continue;
        remaining_[l] = std::max(0.0, remaining_[l] - rate_[i]);
        count_[l] -= weight_[i];
        if (--live_[l] == 0) {
          HeapRemove(l);
          continue;
        }
        share_[l] = remaining_[l] / std::max(count_[l], 1e-12);
        if (heap_pos_[l] >= 0) {
          SiftDown(heap_pos_[l]);
          SiftUp(heap_pos_[l]);
        }
      }
    };
    size_t next_cap = 0;
    while (true) {
      while (next_cap < capped_.size() && fixed_[capped_[next_cap].second]) ++next_cap;
      const bool have_link = !heap_.empty();
      const bool have_cap = next_cap < capped_.size();
      if (!have_link && !have_cap) break;
      if (have_cap && (!have_link || capped_[next_cap].first <= share_[heap_[0]])) {
        fix(capped_[next_cap].second, capped_[next_cap].first * weight_[capped_[next_cap].second],
            UINT32_MAX);
        ++next_cap;
        continue;
      }
      const uint32_t l = heap_[0];
      const double share = share_[l];
      HeapRemove(l);
      for (uint32_t k = link_begin_[l]; k < link_begin_[l + 1]; ++k) {
        const uint32_t i = link_flows_[k];
        if (!fixed_[i]) fix(i, share * weight_[i], l);
      }
      count_[l] = 0;
      live_[l] = 0;
    }
  }

  const std::vector<Flow>& flows_;
  SimOptions options_;
  std::vector<double> capacity_, remaining_;
  std::vector<double> count_, weight_;
  std::vector<int64_t> live_;
  std::vector<uint32_t> order_;
  std::vector<int32_t> own_group_, parent_group_;
  std::vector<double> group_total_, group_sent_, inflow_;
  std::vector<uint32_t> flow_link_begin_, flow_links_;  // Each flow's links (CSR).
  std::vector<uint32_t> link_begin_, link_flows_;       // Each link's flows not done (CSR).
  std::vector<double> sent_, rate_, cap_;
  std::vector<uint8_t> done_, fixed_;
  std::vector<double> share_;
  std::vector<uint32_t> heap_;
  std::vector<int32_t> heap_pos_;
  std::vector<std::pair<double, uint32_t>> capped_;
  size_t listed_ = 0;
  int max_iterations_ = 1;
};

}  // namespace

SimResult Simulate(const std::vector<Flow>& flows, int32_t world_size, const Topology& topology,
                   const SimOptions& options) {
  return Simulator(flows, world_size, topology, options).Run();
}

}  // namespace reshard::plan
