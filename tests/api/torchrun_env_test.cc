// Ranks started the way torchrun starts them: only RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT and TORCHELASTIC_RUN_ID, no RESHARD_* variable. Communicator::FromEnvironment must
// find its identity and local rank there, rank 0 must serve reshard's store on MASTER_PORT + 1
// (MASTER_PORT is held here, as torch's own TCPStore holds it), and a real refit over the
// forked ranks must be byte-exact.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "tests/api/forked_ranks.h"
#include "tests/testing/multiprocess.h"

namespace reshard {
namespace {

constexpr int kWorld = 3;
constexpr int kSteps = 3;

// A TCP socket listening on 127.0.0.1:`port` (0: any), or -1.
int Listen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 8) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int PortOf(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// The value every refit writes at global element `index` in step `step`.
int32_t Expected(int step, int64_t index) { return static_cast<int32_t>(step * 100000 + index); }

// Element `index` of a tile (row-major over [lo, hi)) in its buffer, and its global index.
struct Element {
  int64_t buffer_index;
  int64_t global_index;
};
std::vector<Element> ElementsOf(const LocalTile& t) {
  std::vector<Element> out;
  std::vector<int64_t> i(t.lo);
  if (t.num_elements() == 0) return out;
  while (true) {
    int64_t at = t.offset, global = 0;
    for (size_t d = 0; d < i.size(); ++d) {
      at += (i[d] - t.lo[d]) * t.strides[d];
      global = global * t.global_shape[d] + i[d];
    }
    out.push_back({at, global});
    size_t d = i.size();
    while (d > 0 && ++i[d - 1] == t.hi[d - 1]) {
      i[d - 1] = t.lo[d - 1];
      --d;
    }
    if (d == 0) return out;
  }
}

TEST(TorchrunEnvironmentTest, RanksFromTorchrunVariablesRefitByteExact) {
  // torch's TCPStore holds MASTER_PORT for the whole run; the next port must be free for ours.
  int torch_store = -1;
  int master_port = 0;
  for (int attempt = 0; attempt < 50 && torch_store < 0; ++attempt) {
    torch_store = Listen(0);
    ASSERT_GE(torch_store, 0);
    master_port = PortOf(torch_store);
    const int next = master_port < 65535 ? Listen(master_port + 1) : -1;
    if (next < 0) {
      close(torch_store);
      torch_store = -1;
      continue;
    }
    close(next);
  }
  ASSERT_GE(torch_store, 0) << "found no free pair of ports";
  std::random_device rd;
  const std::string run_id = absl::StrCat("test-run-", rd(), "-", rd());

  // Rows of "w" over ranks {0, 1} -> columns over {1, 2}; "b" replicated from 0 onto 1 and 2.
  RefitSpec spec;
  spec.AddTensor("w", DType::kI32, {8, 6}, Layout(Mesh::Range(0, 2), {Shard(0)}),
                 Layout(Mesh::Range(1, 2), {Shard(1)}));
  spec.AddTensor("b", DType::kI32, {5}, Layout(Mesh({0}), {Replicate()}),
                 Layout(Mesh::Range(1, 2), {Replicate()}));

  testing::ForkOptions fork = testing::SharedMemoryUcx(absl::Seconds(90));
  const std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kWorld),
      [&](int32_t rank) -> int {
        for (const char* v : {"RESHARD_RANK", "RESHARD_WORLD_SIZE", "RESHARD_LOCAL_RANK",
                              "RESHARD_STORE", "RESHARD_STORE_PORT", "RESHARD_STORE_TOKEN",
                              "RESHARD_STORE_SERVE", "RESHARD_TIMEOUT_MS", "OMPI_COMM_WORLD_RANK",
                              "SLURM_PROCID"}) {
          unsetenv(v);
        }
        setenv("RANK", std::to_string(rank).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
        setenv("TORCHELASTIC_RUN_ID", run_id.c_str(), 1);
        absl::StatusOr<Communicator> comm = Communicator::FromEnvironment();
        CHILD_EXPECT(comm.ok(), comm.status().ToString());
        CHILD_EXPECT(comm->rank() == rank);
        CHILD_EXPECT(comm->world_size() == kWorld);
        CHILD_EXPECT(comm->local_rank() == rank);
        CHILD_EXPECT(comm->store_description() ==
                         absl::StrCat("tcp://127.0.0.1:", master_port + 1),
                     comm->store_description());

        absl::StatusOr<std::vector<BufferRequirement>> reqs = spec.LocalBuffers(rank);
        CHILD_EXPECT(reqs.ok(), reqs.status().ToString());
        std::vector<std::vector<int32_t>> storage;
        LocalBuffers buffers;
        std::map<std::pair<Side, std::string>, int32_t*> data;
        for (const BufferRequirement& r : *reqs) {
          storage.emplace_back(r.bytes / 4, -1);
          buffers.Add(r.side, r.name, Buffer{storage.back().data(), r.bytes});
          data[{r.side, r.name}] = storage.back().data();
        }
        absl::StatusOr<std::vector<LocalTile>> sources = spec.LocalTiles(rank, Side::kSource);
        absl::StatusOr<std::vector<LocalTile>> dests = spec.LocalTiles(rank, Side::kDestination);
        CHILD_EXPECT(sources.ok() && dests.ok());
        absl::StatusOr<RefitHandle> handle = RefitHandle::Create(*comm, spec, std::move(buffers));
        CHILD_EXPECT(handle.ok(), handle.status().ToString());
        for (int step = 1; step <= kSteps; ++step) {
          for (const LocalTile& t : *sources) {
            for (const Element& e : ElementsOf(t)) {
              data[{Side::kSource, t.buffer}][e.buffer_index] = Expected(step, e.global_index);
            }
          }
          absl::Status st = handle->Execute(absl::Now() + absl::Seconds(30));
          CHILD_EXPECT(st.ok(), st.ToString());
          for (const LocalTile& t : *dests) {
            for (const Element& e : ElementsOf(t)) {
              const int32_t got = data[{Side::kDestination, t.buffer}][e.buffer_index];
              CHILD_EXPECT(got == Expected(step, e.global_index),
                           absl::StrCat(t.tensor, " element ", e.global_index, " step ", step,
                                        ": got ", got));
            }
          }
        }
        return 0;
      },
      fork);
  close(torch_store);
  for (const auto& [rank, code] : codes) EXPECT_EQ(code, 0) << "rank " << rank;
}

}  // namespace
}  // namespace reshard
