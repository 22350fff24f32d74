// The inference side of the example pair: holds vLLM-style shards (fused qkv_proj and
// gate_up_proj buffers), receives the refit after every training step and verifies every
// element it holds against the value the trainer wrote for that step.
#include <cstdio>

#include "examples/model.h"

int main(int argc, char** argv) {
  example::Shape shape;
  if (!example::ParseArgs(argc, argv, shape)) return 2;
  absl::StatusOr<reshard::Communicator> comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) {
    std::fprintf(stderr, "inference: %s\n", comm.status().ToString().c_str());
    return 2;
  }
  const int rank = comm->rank();
  if (rank < shape.trainers() || rank >= shape.trainers() + shape.inference()) {
    std::fprintf(stderr, "inference: rank %d is not an inference rank (%d..%d)\n", rank,
                 shape.trainers(), shape.trainers() + shape.inference() - 1);
    return 2;
  }
  example::RankState state;
  if (int exit_status = example::SetUpRank("inference", *comm, shape, reshard::Side::kDestination, state)) {
    return exit_status;
  }
  const reshard::RefitSpec& spec = state.spec;
  example::OwnedBuffers& owned = state.owned;
  reshard::RefitHandle& handle = *state.handle;
  int64_t total_bytes = 0;
  for (int step = 1; step <= shape.steps; ++step) {
    // Poison what we hold, so an element the refit failed to write cannot pass as correct.
    for (auto& [req, mem] : owned.buffers) std::memset(mem.data(), 0xA5, mem.size());
    absl::Status st = handle.Execute(absl::Seconds(60));
    if (!st.ok()) {
      std::fprintf(stderr, "inference rank %d step %d: %s\n", rank, step, st.ToString().c_str());
      return 1;
    }
    int64_t checked = 0;
    for (const reshard::LocalTile& tile : state.tiles) {
      size_t tensor = 0;
      while (spec.tensors()[tensor].name != tile.tensor) ++tensor;
      const uint8_t* base = owned.Find(tile.buffer);
      const int eb = reshard::DTypeSize(tile.dtype);
      bool bad = false;
      int64_t bad_index = 0;
      example::ForEachElement(tile, [&](int64_t offset, int64_t global) {
        if (!bad && !example::Matches(base, offset, eb, example::Value(step, tensor, global))) {
          bad = true;
          bad_index = global;
        }
        ++checked;
      });
      if (bad) {
        std::fprintf(stderr,
                     "inference rank %d step %d: tensor \"%s\" element %lld (flat index) holds "
                     "the wrong value\n",
                     rank, step, tile.tensor.c_str(), static_cast<long long>(bad_index));
        return 1;
      }
    }
    const reshard::Stats& s = handle.stats();
    total_bytes += s.bytes_network_received;
    std::printf(
        "inference rank %d step %d: verified %lld elements; received %lld bytes in %.2f ms "
        "(%lld pieces, %lld new registrations, transports %s)\n",
        rank, step, static_cast<long long>(checked),
        static_cast<long long>(s.bytes_network_received), s.total_seconds * 1e3,
        static_cast<long long>(s.pieces_received),
        static_cast<long long>(s.registrations_this_refit), s.transports.c_str());
  }
  std::printf("inference rank %d: %d refits verified, %lld bytes received\n", rank, shape.steps,
              static_cast<long long>(total_bytes));
  std::fflush(stdout);
  return 0;
}
