// The trainer side of the example pair: holds its Megatron-style shards, "trains" (writes new
// values into them) and refits the inference ranks after every step.
//
//   mpirun --allow-run-as-root --oversubscribe -x RESHARD_STORE=127.0.0.1:29600 (continued)
//       -x RESHARD_STORE_TOKEN=secret -np 2 ./trainer : -np 2 ./inference
#include <cstdio>

#include "examples/model.h"

int main(int argc, char** argv) {
  example::Shape shape;
  if (!example::ParseArgs(argc, argv, shape)) return 2;
  absl::StatusOr<reshard::Communicator> comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) {
    std::fprintf(stderr, "trainer: %s\n", comm.status().ToString().c_str());
    return 2;
  }
  const int rank = comm->rank();
  if (rank >= shape.trainers()) {
    std::fprintf(stderr, "trainer: rank %d is not a trainer rank (trainers are 0..%d)\n", rank,
                 shape.trainers() - 1);
    return 2;
  }
  example::RankState state;
  if (int exit_status = example::SetUpRank("trainer", *comm, shape, reshard::Side::kSource, state)) {
    return exit_status;
  }
  const reshard::RefitSpec& spec = state.spec;
  example::OwnedBuffers& owned = state.owned;
  reshard::RefitHandle& handle = *state.handle;
  for (int step = 1; step <= shape.steps; ++step) {
    // "Training": new weights every step.
    for (const reshard::LocalTile& tile : state.tiles) {
      size_t tensor = 0;
      while (spec.tensors()[tensor].name != tile.tensor) ++tensor;
      uint8_t* base = owned.Find(tile.buffer);
      const int eb = reshard::DTypeSize(tile.dtype);
      example::ForEachElement(tile, [&](int64_t offset, int64_t global) {
        example::Store(base, offset, eb, example::Value(step, tensor, global));
      });
    }
    absl::Status st = handle.Execute(absl::Seconds(60));
    if (!st.ok()) {
      std::fprintf(stderr, "trainer rank %d step %d: %s\n", rank, step, st.ToString().c_str());
      return 1;
    }
    const reshard::Stats& s = handle.stats();
    std::printf("trainer rank %d step %d: sent %lld bytes in %.2f ms (%lld puts)\n", rank, step,
                static_cast<long long>(s.bytes_network_sent), s.total_seconds * 1e3,
                static_cast<long long>(s.puts));
  }
  std::fflush(stdout);
  return 0;
}
