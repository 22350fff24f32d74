// reshard-bench-mpi: the MPI reference for `reshard bench --mpi`: the same redistribution as a
// refit spec, done with one MPI_Alltoallw per tensor whose send and receive types are subarray
// datatypes (MPI_Type_create_subarray) of each rank's tiles. Started by mpirun:
//
//   mpirun --allow-run-as-root --oversubscribe -np W reshard-bench-mpi --spec SPEC.json --iters N
//
// Replicated source tiles are sent by the holder the destination already is, else spread over
// the holders (destination rank modulo holders). Tensors placed through views into fused
// buffers are not supported (subarrays describe whole tiles): rank 0 then prints
// {"ok":false,"unsupported":"..."} and exits 3. Rank 0 prints one line of JSON:
// {"ok":true,"mpi_ms":MEDIAN,"iter_ms":[...]} with each iteration's time being the slowest
// rank's. The first iteration's result is verified element by element.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reshard/reshard.h"

// Read by AddressSanitizer at start-up in sanitizer builds (scripts/sanitizers.sh), unused
// otherwise. Open MPI leaks by design in MPI_Init, in its progress thread and in the components
// it unloads at MPI_Finalize (whose frames a report cannot even name), so leak checking is off
// in this MPI reference program only; every other ASan check stays on.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

namespace {

uint64_t Value(size_t tensor, int64_t index) {
  uint64_t x = (static_cast<uint64_t>(tensor) << 40) ^ static_cast<uint64_t>(index);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Tile {
  bool held = false;
  std::vector<int64_t> lo, hi;
  int64_t elements() const {
    int64_t n = 1;
    for (size_t d = 0; d < lo.size(); ++d) n *= hi[d] - lo[d];
    return n;
  }
};

bool Intersect(const Tile& a, const Tile& b, std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  if (!a.held || !b.held) return false;
  lo.resize(a.lo.size());
  hi.resize(a.lo.size());
  for (size_t d = 0; d < a.lo.size(); ++d) {
    lo[d] = std::max(a.lo[d], b.lo[d]);
    hi[d] = std::min(a.hi[d], b.hi[d]);
    if (lo[d] >= hi[d]) return false;
  }
  return true;
}

// Subarray of `box` inside `tile` (C order) of elements of `elem` type.
MPI_Datatype Subarray(const Tile& tile, const std::vector<int64_t>& lo,
                      const std::vector<int64_t>& hi, MPI_Datatype elem) {
  const int nd = static_cast<int>(tile.lo.size());
  std::vector<int> sizes(nd), subsizes(nd), starts(nd);
  for (int d = 0; d < nd; ++d) {
    sizes[d] = static_cast<int>(tile.hi[d] - tile.lo[d]);
    subsizes[d] = static_cast<int>(hi[d] - lo[d]);
    starts[d] = static_cast<int>(lo[d] - tile.lo[d]);
  }
  MPI_Datatype t;
  MPI_Type_create_subarray(nd, sizes.data(), subsizes.data(), starts.data(), MPI_ORDER_C, elem, &t);
  MPI_Type_commit(&t);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string spec_path;
  int iters = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--spec") == 0) spec_path = argv[i + 1];
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::max(1, std::atoi(argv[i + 1]));
  }
  auto spec = reshard::RefitSpec::FromFile(spec_path);
  std::vector<MPI_Datatype> committed;  // the subarray types, freed before MPI_Finalize
  auto finish = [&](const std::string& json, int code) {
    if (rank == 0) std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    for (MPI_Datatype& t : committed) MPI_Type_free(&t);
    MPI_Finalize();
    return code;
  };
  if (!spec.ok()) return finish("{\"ok\":false,\"error\":\"cannot read the spec\"}", 2);
  if (spec->WorldSize() > world) {
    return finish("{\"ok\":false,\"error\":\"mpirun -np is smaller than the spec's world\"}", 2);
  }
  const auto& tensors = spec->tensors();
  for (const auto& t : tensors) {
    if (t.src.has_view || t.dst.has_view || t.shape.empty()) {
      return finish("{\"ok\":false,\"unsupported\":\"tensor " + t.name +
                        " uses a buffer view or is 0-D; subarray types describe whole tiles\"}",
                    3);
    }
  }
  // Every rank's tile of every tensor on both sides.
  const size_t T = tensors.size();
  std::vector<std::vector<Tile>> src(T, std::vector<Tile>(world)), dst(T, std::vector<Tile>(world));
  for (int r = 0; r < world; ++r) {
    for (int side = 0; side < 2; ++side) {
      auto tiles = spec->LocalTiles(r, static_cast<reshard::Side>(side));
      if (!tiles.ok()) return finish("{\"ok\":false,\"error\":\"tiles\"}", 2);
      size_t t = 0;
      for (const reshard::LocalTile& lt : *tiles) {
        while (tensors[t].name != lt.tensor) ++t;
        Tile& tile = (side == 0 ? src : dst)[t][r];
        tile.held = true;
        tile.lo = lt.lo;
        tile.hi = lt.hi;
      }
    }
  }
  // sender[t][j][i]: rank i sends its source tile's part to j.
  auto sends = [&](size_t t, int i, int j) {
    if (!src[t][i].held || !dst[t][j].held) return false;
    std::vector<int> holders;
    for (int r = 0; r < world; ++r) {
      if (src[t][r].held && src[t][r].lo == src[t][i].lo && src[t][r].hi == src[t][i].hi) {
        holders.push_back(r);
      }
    }
    if (std::find(holders.begin(), holders.end(), j) != holders.end()) return i == j;
    return holders[j % holders.size()] == i;
  };
  struct Exchange {
    std::vector<uint8_t> send, recv;
    std::vector<int> counts_s, counts_r, displs;
    std::vector<MPI_Datatype> types_s, types_r;
    MPI_Datatype elem;
  };
  std::vector<Exchange> ex(T);
  std::vector<int64_t> lo, hi;
  for (size_t t = 0; t < T; ++t) {
    Exchange& e = ex[t];
    const int eb = reshard::DTypeSize(tensors[t].dtype);
    // A native type of the element's size keeps Open MPI's datatype engine on its fast paths
    // (a derived 2-byte type packs element by element).
    e.elem = eb == 1 ? MPI_UINT8_T : eb == 2 ? MPI_UINT16_T : eb == 4 ? MPI_UINT32_T : MPI_UINT64_T;
    e.send.assign(static_cast<size_t>(std::max<int64_t>(1, src[t][rank].elements() * eb)), 0);
    e.recv.assign(static_cast<size_t>(std::max<int64_t>(1, dst[t][rank].elements() * eb)), 0);
    e.counts_s.assign(world, 0);
    e.counts_r.assign(world, 0);
    e.displs.assign(world, 0);
    e.types_s.assign(world, MPI_BYTE);
    e.types_r.assign(world, MPI_BYTE);
    for (int j = 0; j < world; ++j) {
      if (sends(t, rank, j) && Intersect(src[t][rank], dst[t][j], lo, hi)) {
        e.counts_s[j] = 1;
        e.types_s[j] = Subarray(src[t][rank], lo, hi, e.elem);
        committed.push_back(e.types_s[j]);
      }
      if (sends(t, j, rank) && Intersect(src[t][j], dst[t][rank], lo, hi)) {
        e.counts_r[j] = 1;
        e.types_r[j] = Subarray(dst[t][rank], lo, hi, e.elem);
        committed.push_back(e.types_r[j]);
      }
    }
    // Fill the source tile: element value from its global index.
    const Tile& s = src[t][rank];
    if (s.held) {
      const auto& shape = tensors[t].shape;
      const int nd = static_cast<int>(shape.size());
      for (int64_t k = 0; k < s.elements(); ++k) {
        int64_t rem = k, global = 0, stride = 1;
        std::vector<int64_t> idx(nd);
        for (int d = nd - 1; d >= 0; --d) {
          idx[d] = rem % (s.hi[d] - s.lo[d]);
          rem /= (s.hi[d] - s.lo[d]);
        }
        for (int d = nd - 1; d >= 0; --d) {
          global += (s.lo[d] + idx[d]) * stride;
          stride *= shape[d];
        }
        const uint64_t v = Value(t, global);
        std::memcpy(e.send.data() + k * eb, &v, eb);
      }
    }
  }
  std::vector<double> iter_ms;
  for (int it = 0; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (size_t t = 0; t < T; ++t) {
      Exchange& e = ex[t];
      MPI_Alltoallw(e.send.data(), e.counts_s.data(), e.displs.data(), e.types_s.data(),
                    e.recv.data(), e.counts_r.data(), e.displs.data(), e.types_r.data(),
                    MPI_COMM_WORLD);
    }
    double local = (MPI_Wtime() - t0) * 1e3, slowest = 0;
    MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    iter_ms.push_back(slowest);
    if (it == 0) {
      int bad = 0;
      for (size_t t = 0; t < T && !bad; ++t) {
        const Tile& d = dst[t][rank];
        if (!d.held) continue;
        const auto& shape = tensors[t].shape;
        const int nd = static_cast<int>(shape.size());
        const int eb = reshard::DTypeSize(tensors[t].dtype);
        for (int64_t k = 0; k < d.elements() && !bad; ++k) {
          int64_t rem = k, global = 0, stride = 1;
          std::vector<int64_t> idx(nd);
          for (int dd = nd - 1; dd >= 0; --dd) {
            idx[dd] = rem % (d.hi[dd] - d.lo[dd]);
            rem /= (d.hi[dd] - d.lo[dd]);
          }
          for (int dd = nd - 1; dd >= 0; --dd) {
            global += (d.lo[dd] + idx[dd]) * stride;
            stride *= shape[dd];
          }
          const uint64_t v = Value(t, global);
          if (std::memcmp(ex[t].recv.data() + k * eb, &v, eb) != 0) bad = 1;
        }
      }
      int any_bad = 0;
      MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (any_bad) return finish("{\"ok\":false,\"error\":\"MPI_Alltoallw result is wrong\"}", 1);
    }
  }
  std::vector<double> sorted = iter_ms;
  std::sort(sorted.begin(), sorted.end());
  std::string json =
      "{\"ok\":true,\"mpi_ms\":" + std::to_string(sorted[sorted.size() / 2]) + ",\"iter_ms\":[";
  for (size_t i = 0; i < iter_ms.size(); ++i) json += (i ? "," : "") + std::to_string(iter_ms[i]);
  json += "]}";
  return finish(json, 0);
}
