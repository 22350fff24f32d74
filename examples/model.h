// The model both example programs agree on: a small transformer (vocab-parallel embeddings,
// attention with fused qkv on the inference side, MLP with fused gate_up, a mixture of experts
// layer, norms), with Megatron-style trainer layouts and vLLM-style inference layouts, written
// against the public API only. Trainer ranks are [0, T), inference ranks [T, T + I).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "reshard/reshard.h"

namespace example {

struct Shape {
  int train_tp = 2;  // Trainer tensor parallel (also expert parallel) degree.
  int infer_tp = 2;  // Inference tensor parallel degree.
  int infer_dp = 1;  // Inference replicas.
  int steps = 10;
  int64_t hidden = 256, heads = 8, kv_heads = 4, head_dim = 32, intermediate = 512;
  int64_t vocab = 1024, layers = 2, experts = 4, expert_intermediate = 128;
  int trainers() const { return train_tp; }
  int inference() const { return infer_tp * infer_dp; }
};

// Parses --steps N --train-tp N --infer-tp N --infer-dp N. Returns false (after printing) on
// bad usage.
inline bool ParseArgs(int argc, char** argv, Shape& s) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    int* target = a == "--steps"      ? &s.steps
                  : a == "--train-tp" ? &s.train_tp
                  : a == "--infer-tp" ? &s.infer_tp
                  : a == "--infer-dp" ? &s.infer_dp
                                      : nullptr;
    if (target == nullptr || i + 1 >= argc || std::atoi(argv[i + 1]) <= 0) {
      std::fprintf(stderr, "usage: %s [--steps N] [--train-tp N] [--infer-tp N] [--infer-dp N]\n",
                   argv[0]);
      return false;
    }
    *target = std::atoi(argv[++i]);
  }
  return true;
}

// The refit spec. Trainer: column-parallel weights shard dim 0, row-parallel dim 1, experts over
// the trainer ranks (EP). Inference: TP x DP mesh; q/k/v land in one fused qkv_proj buffer per
// rank and gate/up in gate_up_proj, experts are split along their intermediate dim (expert TP).
inline reshard::RefitSpec MakeSpec(const Shape& s) {
  using reshard::DType;
  using reshard::Layout;
  using reshard::Mesh;
  using reshard::Replicate;
  using reshard::Shard;
  const int T = s.trainers();
  const Mesh train = Mesh::Range(0, T);
  // Inference mesh [dp, tp]: replicas along axis 0.
  const Mesh infer = Mesh::Range(T, s.inference()).Reshape({s.infer_dp, s.infer_tp});
  auto tcol = [&] { return Layout(train, {Shard(0)}); };
  auto trow = [&] { return Layout(train, {Shard(1)}); };
  auto trep = [&] { return Layout(train, {Replicate()}); };
  auto icol = [&] { return Layout(infer, {Replicate(), Shard(0)}); };
  auto irow = [&] { return Layout(infer, {Replicate(), Shard(1)}); };
  auto irep = [&] { return Layout(infer, {Replicate(), Replicate()}); };

  reshard::RefitSpec spec;
  spec.SetComment("examples/model.h: a small transformer refitted from trainer to inference");
  const int64_t H = s.hidden, q_rows = s.heads * s.head_dim, kv_rows = s.kv_heads * s.head_dim;
  spec.AddTensor("embed_tokens", DType::kBf16, {s.vocab, H}, tcol(), icol());
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    spec.AddTensor(p + "input_norm", DType::kFp32, {H}, trep(), irep());
    // Fused qkv on each inference rank: [q_local; k_local; v_local], rows of H elements.
    const int64_t ql = q_rows / s.infer_tp, kl = kv_rows / s.infer_tp;
    spec.AddTensor(p + "q_proj", DType::kBf16, {q_rows, H}, tcol(),
                   icol().InBuffer(p + "qkv_proj", 0));
    spec.AddTensor(p + "k_proj", DType::kBf16, {kv_rows, H}, tcol(),
                   icol().InBuffer(p + "qkv_proj", ql * H));
    spec.AddTensor(p + "v_proj", DType::kBf16, {kv_rows, H}, tcol(),
                   icol().InBuffer(p + "qkv_proj", (ql + kl) * H));
    spec.AddTensor(p + "o_proj", DType::kBf16, {H, q_rows}, trow(), irow());
    if (l % 2 == 0) {
      const int64_t il = s.intermediate / s.infer_tp;
      spec.AddTensor(p + "gate_proj", DType::kBf16, {s.intermediate, H}, tcol(),
                     icol().InBuffer(p + "gate_up_proj", 0));
      spec.AddTensor(p + "up_proj", DType::kBf16, {s.intermediate, H}, tcol(),
                     icol().InBuffer(p + "gate_up_proj", il * H));
      spec.AddTensor(p + "down_proj", DType::kBf16, {H, s.intermediate}, trow(), irow());
    } else {
      // Experts: [E, I_e, H] split over experts on the trainer, over I_e on inference.
      spec.AddTensor(p + "experts.w1", DType::kBf16, {s.experts, s.expert_intermediate, H},
                     Layout(train, {Shard(0)}), Layout(infer, {Replicate(), Shard(1)}));
      spec.AddTensor(p + "experts.w2", DType::kBf16, {s.experts, H, s.expert_intermediate},
                     Layout(train, {Shard(0)}), Layout(infer, {Replicate(), Shard(2)}));
      spec.AddTensor(p + "router", DType::kFp32, {s.experts, H}, trep(), irep());
    }
  }
  spec.AddTensor("lm_head", DType::kBf16, {s.vocab, H}, tcol(), icol());
  return spec;
}

// The value of element `index` of tensor `tensor` at `step`: a strong mix, so a stale, shifted
// or misplaced element never matches by chance.
inline uint64_t Value(int step, size_t tensor, int64_t index) {
  uint64_t x = (static_cast<uint64_t>(step) << 48) ^ (static_cast<uint64_t>(tensor) << 40) ^
               static_cast<uint64_t>(index);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Calls fn(element offset in the buffer, global flat index) for every element of `tile`.
template <typename Fn>
void ForEachElement(const reshard::LocalTile& tile, Fn&& fn) {
  const size_t nd = tile.lo.size();
  for (size_t d = 0; d < nd; ++d) {
    if (tile.hi[d] <= tile.lo[d]) return;
  }
  std::vector<int64_t> idx(nd, 0);
  while (true) {
    int64_t offset = tile.offset, global = 0;
    for (size_t d = 0; d < nd; ++d) {
      offset += idx[d] * tile.strides[d];
      global = global * tile.global_shape[d] + tile.lo[d] + idx[d];
    }
    fn(offset, global);
    size_t d = nd;
    while (d > 0) {
      --d;
      if (++idx[d] < tile.hi[d] - tile.lo[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 0) return;
  }
}

// Writes / compares one element of `elem_bytes` (the low bytes of the value).
inline void Store(uint8_t* buffer, int64_t offset, int elem_bytes, uint64_t value) {
  std::memcpy(buffer + offset * elem_bytes, &value, elem_bytes);
}
inline bool Matches(const uint8_t* buffer, int64_t offset, int elem_bytes, uint64_t value) {
  return std::memcmp(buffer + offset * elem_bytes, &value, elem_bytes) == 0;
}

// Page-aligned zeroed host buffers, one per requirement, registered in `out`.
struct OwnedBuffers {
  std::vector<std::pair<reshard::BufferRequirement, std::vector<uint8_t>>> buffers;
  uint8_t* Find(const std::string& name) {
    for (auto& [req, mem] : buffers) {
      if (req.name == name) return mem.data();
    }
    return nullptr;
  }
};
inline reshard::LocalBuffers Allocate(const std::vector<reshard::BufferRequirement>& reqs,
                                      OwnedBuffers& owned) {
  reshard::LocalBuffers out;
  owned.buffers.reserve(reqs.size());
  for (const reshard::BufferRequirement& r : reqs) {
    owned.buffers.emplace_back(r, std::vector<uint8_t>(static_cast<size_t>(r.bytes)));
    out.Add(r.side, r.name, reshard::Buffer{owned.buffers.back().second.data(), r.bytes});
  }
  return out;
}

// What one example rank sets up once: the spec, the tiles it holds on its side, its buffers and
// the refit handle (created once, executed every step).
struct RankState {
  reshard::RefitSpec spec;
  std::vector<reshard::LocalTile> tiles;
  OwnedBuffers owned;
  std::optional<reshard::RefitHandle> handle;
};

// Sets up `state` for this rank as `role` ("trainer" or "inference") on `side`. Returns 0, or
// the exit status after printing one line naming the role and rank: 2 for bad input, 1 when
// the handle cannot be created.
inline int SetUpRank(const char* role, const reshard::Communicator& comm, const Shape& shape,
                     reshard::Side side, RankState& state) {
  const int rank = comm.rank();
  state.spec = MakeSpec(shape);
  auto reqs = state.spec.LocalBuffers(rank);
  auto tiles = state.spec.LocalTiles(rank, side);
  if (!reqs.ok() || !tiles.ok()) {
    std::fprintf(stderr, "%s rank %d: %s\n", role, rank,
                 (!reqs.ok() ? reqs.status() : tiles.status()).ToString().c_str());
    return 2;
  }
  state.tiles = *std::move(tiles);
  reshard::LocalBuffers buffers = Allocate(*reqs, state.owned);
  absl::StatusOr<reshard::RefitHandle> handle =
      reshard::RefitHandle::Create(comm, state.spec, std::move(buffers));
  if (!handle.ok()) {
    std::fprintf(stderr, "%s rank %d: %s\n", role, rank, handle.status().ToString().c_str());
    return 1;
  }
  state.handle.emplace(*std::move(handle));
  return 0;
}

}  // namespace example
