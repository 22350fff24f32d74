// reshard-bench-rank: one process of `reshard bench`, written against the public API only.
//
//   reshard-bench-rank --spec SPEC.json --iters N [--verify ends|all|none] [--delta 1]
//                      [--change-fraction F]
//
// Identity and store come from the environment (the launcher sets RESHARD_*). The same process
// builds one handle per mode, once, over the same source and destination buffers:
//   ours              the domain-aware plan (the product);
//   naive             point-to-point: every destination rank gets its tile from a source;
//   gather_broadcast  the traditional refit with the same engine: every tensor is gathered whole
//                     on the smallest rank of its source mesh, broadcast whole to every
//                     destination rank (planned domain-aware, so the root's NIC is relieved by
//                     relays: a tree broadcast), and each destination keeps its slice (a local
//                     copy).
//   delta             (--delta 1) ours with delta refits (docs/delta.md): its destinations are
//                     never poisoned (it builds on what they hold; every mode leaves them with
//                     the same values).
// With --change-fraction F each iteration after the first changes a fraction F of the source
// elements (TilePatterns::Change) instead of all of them.
// Each iteration fills the sources with new values and runs every mode once, the order rotating
// per iteration (interleaved), each preceded by a tiny all-gather that lines the ranks up. Times
// are per rank, from before the mode's first Start to the end of its last Wait. Destinations are
// poisoned before and verified after each mode (first and last iteration by default).
// Prints one line of JSON: {"rank":R,"ok":true,"ms":{"ours":[...],...},"bytes_sent":{...},
// "bytes_fanout":{...},
// "transports":"...","error":""}. Exit 0 ok, 1 failure, 2 bad input.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "reshard/reshard.h"
#include "src/common/escape.h"
#include "tools/reshard/tile_fill.h"

namespace {


// Buffers by (side, name). Scratch buffers of gather-broadcast ("gather:<t>", "bcast:<t>") are
// the destination of one stage and the source of the next, so they are keyed by name alone.
// Destinations and scratch are HostBuffers, as a user's on one host would be (same-host senders
// map them: one memcpy per run); sources are private memory.
struct Buffers {
  std::map<std::pair<int, std::string>, std::vector<uint8_t>> mem;  // (side, name) -> bytes
  std::map<std::pair<int, std::string>, reshard::HostBuffer> shared;
  static std::pair<int, std::string> Key(reshard::Side side, const std::string& name) {
    return {name.find(':') != std::string::npos ? -1 : static_cast<int>(side), name};
  }
  uint8_t* Get(reshard::Side side, const std::string& name) {
    if (auto it = shared.find(Key(side, name)); it != shared.end()) {
      return static_cast<uint8_t*>(it->second.data());
    }
    auto it = mem.find(Key(side, name));
    return it == mem.end() ? nullptr : it->second.data();
  }
  // Allocates what `spec` needs on `rank` (once per name) and lists it for a handle.
  absl::StatusOr<reshard::LocalBuffers> For(const reshard::RefitSpec& spec, int rank) {
    auto reqs = spec.LocalBuffers(rank);
    if (!reqs.ok()) return reqs.status();
    reshard::LocalBuffers out;
    for (const reshard::BufferRequirement& r : *reqs) {
      const auto key = Key(r.side, r.name);
      uint8_t* data = Get(r.side, r.name);
      if (data == nullptr && (r.side == reshard::Side::kDestination || key.first < 0) &&
          r.bytes > 0) {
        absl::StatusOr<reshard::HostBuffer> hb =
            reshard::HostBuffer::Allocate(r.bytes, absl::StrCat("b", rank, "-", r.name));
        if (!hb.ok()) return hb.status();
        data = static_cast<uint8_t*>(hb->data());
        shared.emplace(key, *std::move(hb));
      } else if (data == nullptr) {
        auto& m = mem[key];
        m.assign(static_cast<size_t>(std::max<int64_t>(r.bytes, 1)), 0);
        data = m.data();
      }
      out.Add(r.side, r.name, reshard::Buffer{data, r.bytes});
    }
    return out;
  }
};

// The three stages of gather-broadcast as specs over scratch buffers "gather:<t>" and
// "bcast:<t>"; sources of stage 1 and destinations of stage 3 are the original buffers.
std::vector<reshard::RefitSpec> GatherBroadcastSpecs(const reshard::RefitSpec& spec) {
  using reshard::Layout;
  using reshard::Mesh;
  using reshard::Replicate;
  reshard::RefitSpec gather, bcast, slice;
  for (reshard::RefitSpec* s : {&gather, &bcast, &slice}) {
    if (!spec.domains().empty()) s->SetDomains(spec.domains());
    if (spec.ranks_per_domain() > 0) s->SetRanksPerDomain(spec.ranks_per_domain());
  }
  for (const reshard::TensorDesc& t : spec.tensors()) {
    const int32_t root = *std::min_element(t.src.mesh.ranks().begin(), t.src.mesh.ranks().end());
    std::set<int32_t> dst_set(t.dst.mesh.ranks().begin(), t.dst.mesh.ranks().end());
    const Mesh dst_ranks(std::vector<int32_t>(dst_set.begin(), dst_set.end()));
    const Mesh root_mesh(std::vector<int32_t>{root});
    if (t.src.quant_scheme != reshard::QuantScheme::kNone) {
      // An FP8 source: its bytes and its scales are gathered and broadcast as they are, and each
      // destination rank takes its tile from its replicated copy (moved as it is, or dequantized
      // and quantized again, as the refit itself does).
      const reshard::DType fp8 = *t.src.dtype;
      const std::vector<int64_t> block =
          reshard::QuantBlockShape(t.shape, t.src.quant_scheme, t.src.quant_block);
      std::vector<int64_t> blocked(t.shape.size());
      for (size_t d = 0; d < t.shape.size(); ++d) {
        blocked[d] = (t.shape[d] + block[d] - 1) / block[d];
      }
      const reshard::DType scale_dtype = t.src.quant_scheme == reshard::QuantScheme::kMx
                                             ? reshard::DType::kU8
                                             : reshard::DType::kFp32;
      const std::string scales = t.name + ".scale";
      Layout elements(t.src.mesh, t.src.placements);
      elements.buffer = t.src.buffer;
      elements.view_offset = t.src.view_offset;
      elements.view_strides = t.src.view_strides;
      elements.has_view = t.src.has_view;
      // The source's scales: a mesh axis that shards a dim of one block replicates it.
      Layout scale_src(t.src.mesh, t.src.placements);
      for (reshard::Placement& p : scale_src.placements) {
        if (p.shard && t.shape[p.dim] <= block[p.dim]) p = Replicate();
      }
      scale_src.InBuffer(t.src.scale_buffer.empty() ? scales : t.src.scale_buffer,
                         t.src.scale_view_offset, t.src.scale_view_strides);
      gather.AddTensor(t.name, fp8, t.shape, elements,
                       Layout(root_mesh, {Replicate()}).InBuffer("gather:" + t.name));
      gather.AddTensor(scales, scale_dtype, blocked, scale_src,
                       Layout(root_mesh, {Replicate()}).InBuffer("gather:" + scales));
      bcast.AddTensor(t.name, fp8, t.shape,
                      Layout(root_mesh, {Replicate()}).InBuffer("gather:" + t.name),
                      Layout(dst_ranks, {Replicate()}).InBuffer("bcast:" + t.name));
      bcast.AddTensor(scales, scale_dtype, blocked,
                      Layout(root_mesh, {Replicate()}).InBuffer("gather:" + scales),
                      Layout(dst_ranks, {Replicate()}).InBuffer("bcast:" + scales));
      Layout copy(dst_ranks, {Replicate()});
      copy.InBuffer("bcast:" + t.name)
          .Quantized(fp8, t.src.quant_scheme, t.src.quant_block)
          .ScalesInBuffer("bcast:" + scales);
      slice.AddTensor(t.name, t.dtype, t.shape, copy, t.dst);
      continue;
    }
    gather.AddTensor(t.name, t.dtype, t.shape, t.src,
                     Layout(root_mesh, {Replicate()}).InBuffer("gather:" + t.name));
    bcast.AddTensor(t.name, t.dtype, t.shape,
                    Layout(root_mesh, {Replicate()}).InBuffer("gather:" + t.name),
                    Layout(dst_ranks, {Replicate()}).InBuffer("bcast:" + t.name));
    slice.AddTensor(t.name, t.dtype, t.shape,
                    Layout(dst_ranks, {Replicate()}).InBuffer("bcast:" + t.name), t.dst);
  }
  return {gather, bcast, slice};
}

// The same refit with every destination as the source's dtype (no quantization): what
// `reshard bench --dst-dtype` compares with. Its destinations live in buffers of their own
// ("unquantized:<buffer>"), the sources are the same.
reshard::RefitSpec Unquantized(const reshard::RefitSpec& spec) {
  reshard::RefitSpec out;
  if (!spec.domains().empty()) out.SetDomains(spec.domains());
  if (spec.ranks_per_domain() > 0) out.SetRanksPerDomain(spec.ranks_per_domain());
  for (const reshard::TensorDesc& t : spec.tensors()) {
    // An FP8 source moves its bytes as they are (its scales stay behind).
    reshard::Layout src = t.src;
    const reshard::DType dtype = src.dtype.value_or(t.dtype);
    src.dtype.reset();
    src.quant_scheme = reshard::QuantScheme::kNone;
    src.quant_block.clear();
    src.scale_buffer.clear();
    src.scale_view_offset = 0;
    src.scale_view_strides.clear();
    src.has_scale_view = false;
    reshard::Layout dst = t.dst;
    dst.dtype.reset();
    dst.quant_scheme = reshard::QuantScheme::kNone;
    dst.quant_block.clear();
    dst.scale_buffer.clear();
    dst.scale_view_offset = 0;
    dst.scale_view_strides.clear();
    dst.has_scale_view = false;
    dst.buffer = "unquantized:" + (t.dst.buffer.empty() ? t.name : t.dst.buffer);
    out.AddTensor(t.name, dtype, t.shape, src, dst);
  }
  return out;
}

bool AnyQuantized(const reshard::RefitSpec& spec) {
  for (const reshard::TensorDesc& t : spec.tensors()) {
    if (t.dst.quant_scheme != reshard::QuantScheme::kNone) return true;
  }
  return false;
}

int Fail(int rank, const std::string& error, int code) {
  std::printf("{\"rank\":%d,\"ok\":false,\"error\":%s}\n", rank, reshard::JsonQuote(error).c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "reshard-bench-rank %d: %s\n", rank, error.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // stdout carries exactly one JSON line: UCX's own messages go to stderr unless the user chose.
  setenv("UCX_LOG_FILE", "stderr", /*overwrite=*/0);
  std::string spec_path, verify = "ends";
  int iters = 5;
  bool delta = false;
  double change_fraction = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--spec")
      spec_path = argv[i + 1];
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--verify")
      verify = argv[i + 1];
    else if (a == "--delta")
      delta = std::string(argv[i + 1]) == "1";
    else if (a == "--change-fraction")
      change_fraction = std::atof(argv[i + 1]);
    else
      return Fail(-1, "unknown argument " + a, 2);
  }
  if (spec_path.empty() || iters < 1) return Fail(-1, "usage: --spec SPEC.json --iters N", 2);
  auto comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) return Fail(-1, comm.status().ToString(), 2);
  const int rank = comm->rank();
  const int world = comm->world_size();
  auto spec = reshard::RefitSpec::FromFile(spec_path);
  if (!spec.ok()) return Fail(rank, spec.status().ToString(), 2);

  // Specs, in mode order, and one handle per spec built once.
  // A spec with quantized destinations is also timed unquantized (`reshard bench --dst-dtype`).
  const bool quantized = AnyQuantized(*spec);
  std::vector<std::string> modes = {"ours", "naive", "gather_broadcast"};
  if (quantized) modes.push_back("unquantized");
  if (delta) modes.push_back("delta");
  const reshard::RefitSpec unquantized = quantized ? Unquantized(*spec) : reshard::RefitSpec();
  reshard::RefitSpec barrier;
  barrier.AddTensor("barrier", reshard::DType::kU8, {world},
                    reshard::Layout(reshard::Mesh::Range(0, world), {reshard::Shard(0)}),
                    reshard::Layout(reshard::Mesh::Range(0, world), {reshard::Replicate()}));
  Buffers buffers, barrier_buffers;
  std::map<std::string, std::vector<reshard::RefitHandle>> handles;
  auto make = [&](const std::string& name, const reshard::RefitSpec& s, reshard::Schedule sched,
                  Buffers& b, bool delta_refits = false) -> absl::Status {
    auto local = b.For(s, rank);
    if (!local.ok()) return local.status();
    reshard::HandleOptions o;
    o.name = name;
    o.schedule = sched;
    o.delta = delta_refits;
    auto h = reshard::RefitHandle::Create(*comm, s, std::move(local).value(), o);
    if (!h.ok()) return h.status();
    handles[name.substr(0, name.find('.'))].push_back(std::move(h).value());
    return absl::OkStatus();
  };
  absl::Status st = make("barrier", barrier, reshard::Schedule::kPointToPoint, barrier_buffers);
  if (st.ok()) st = make("ours", *spec, reshard::Schedule::kDomainAware, buffers);
  if (st.ok()) st = make("naive", *spec, reshard::Schedule::kPointToPoint, buffers);
  const std::vector<reshard::RefitSpec> gb = GatherBroadcastSpecs(*spec);
  for (size_t i = 0; i < gb.size() && st.ok(); ++i) {
    st = make("gather_broadcast." + std::to_string(i), gb[i], reshard::Schedule::kDomainAware,
              buffers);
  }
  if (st.ok() && quantized) {
    st = make("unquantized", unquantized, reshard::Schedule::kDomainAware, buffers);
  }
  if (st.ok() && delta) {
    st = make("delta", *spec, reshard::Schedule::kDomainAware, buffers, /*delta_refits=*/true);
  }
  if (!st.ok())
    return Fail(rank, st.ToString(), st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);

  auto src_tiles = spec->LocalTiles(rank, reshard::Side::kSource);
  auto dst_tiles = spec->LocalTiles(rank, reshard::Side::kDestination);
  if (!src_tiles.ok() || !dst_tiles.ok()) return Fail(rank, "tiles", 2);
  const reshard::cli::TilePatterns patterns(*spec);
  // The unquantized mode's destinations: the same sources' numbers, exactly.
  std::vector<reshard::LocalTile> unquantized_tiles;
  if (quantized) {
    auto tiles = unquantized.LocalTiles(rank, reshard::Side::kDestination);
    if (!tiles.ok()) return Fail(rank, tiles.status().ToString(), 2);
    unquantized_tiles = *std::move(tiles);
  }
  const reshard::cli::TilePatterns unquantized_patterns(unquantized, &*spec);

  std::map<std::string, std::vector<double>> ms;
  std::map<std::string, int64_t> bytes_sent, bytes_fanout;
  std::string transports;
  const absl::Duration timeout = absl::Seconds(120);
  for (int iter = 0; iter < iters; ++iter) {
    for (const reshard::LocalTile& tile : *src_tiles) {
      uint8_t* base = buffers.Get(reshard::Side::kSource, tile.buffer);
      if (change_fraction >= 0 && iter > 0) {
        patterns.Change(tile, static_cast<uint64_t>(iter) + 1, change_fraction, base);
      } else {
        patterns.Fill(tile, static_cast<uint64_t>(iter) + 1, base);
      }
    }
    const bool check = verify == "all" || (verify == "ends" && (iter == 0 || iter == iters - 1));
    for (size_t k = 0; k < modes.size(); ++k) {
      const std::string& mode = modes[(k + iter) % modes.size()];
      const bool plain = mode == "unquantized";
      const std::vector<reshard::LocalTile>& mode_tiles = plain ? unquantized_tiles : *dst_tiles;
      const reshard::cli::TilePatterns& mode_patterns = plain ? unquantized_patterns : patterns;
      if (check && mode != "delta") {
        for (const reshard::LocalTile& tile : mode_tiles) {
          reshard::cli::PoisonTile(tile, buffers.Get(reshard::Side::kDestination, tile.buffer));
        }
      }
      st = handles["barrier"][0].Execute(timeout);
      if (!st.ok()) return Fail(rank, "barrier: " + st.ToString(), 1);
      const absl::Time t0 = absl::Now();
      int64_t sent = 0, fanned = 0;
      for (reshard::RefitHandle& h : handles[mode]) {
        st = h.Execute(absl::Now() + timeout);
        if (!st.ok()) return Fail(rank, mode + ": " + st.ToString(), 1);
        sent += h.stats().bytes_network_sent;
        fanned += h.stats().bytes_fanout_sent;
        if (mode == "ours" && transports.empty()) transports = h.stats().transports;
      }
      ms[mode].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      bytes_sent[mode] = sent;
      bytes_fanout[mode] = fanned;
      if (!check) continue;
      for (const reshard::LocalTile& tile : mode_tiles) {
        const uint8_t* base = buffers.Get(reshard::Side::kDestination, tile.buffer);
        st = change_fraction >= 0
                 ? mode_patterns.VerifyChanged(tile, static_cast<uint64_t>(iter) + 1,
                                               change_fraction, rank, base)
                 : mode_patterns.Verify(tile, static_cast<uint64_t>(iter) + 1, rank, base);
        if (!st.ok()) {
          return Fail(rank,
                      mode + ": after iteration " + std::to_string(iter + 1) + ": " +
                          std::string(st.message()),
                      1);
        }
      }
    }
  }
  std::string out = "{\"rank\":" + std::to_string(rank) + ",\"ok\":true,\"ms\":{";
  bool first = true;
  for (const auto& [mode, v] : ms) {
    out += (first ? "" : ",") + reshard::JsonQuote(mode) + ":[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    out += "]";
    first = false;
  }
  out += "},\"bytes_sent\":{";
  first = true;
  for (const auto& [mode, b] : bytes_sent) {
    out += (first ? "" : ",") + reshard::JsonQuote(mode) + ":" + std::to_string(b);
    first = false;
  }
  out += "},\"bytes_fanout\":{";
  first = true;
  for (const auto& [mode, b] : bytes_fanout) {
    out += (first ? "" : ",") + reshard::JsonQuote(mode) + ":" + std::to_string(b);
    first = false;
  }
  out += "},\"transports\":" + reshard::JsonQuote(transports) + ",\"error\":\"\"}";
  std::printf("%s\n", out.c_str());
  std::fflush(stdout);
  return 0;
}
