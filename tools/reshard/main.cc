// reshard: plan, simulate, run and benchmark weight refits. See `reshard --help`.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "tools/reshard/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"plan", reshard::cli::PlanCommand, "plan a refit spec, verify it in process, explain it"},
    {"sim", reshard::cli::SimCommand, "simulate a refit on a cluster against baselines and the bound"},
    {"spec", reshard::cli::SpecCommand, "write the refit spec of a Hugging Face model (JSON)"},
    {"run", reshard::cli::RunCommand, "launch one process per rank and run real refits over UCX"},
    {"bench", reshard::cli::BenchCommand, "time ours vs naive p2p vs gather-broadcast (and MPI) on real processes"},
    {"store", reshard::cli::StoreCommand, "serve the rendezvous store as a process of its own"},
    {"info", reshard::cli::InfoCommand, "UCX version and transports, memory types, CUDA, NCCL, RDMA NICs"},
};

void PrintHelp() {
  std::printf(
      "usage: reshard <command> [options]\n\n"
      "Refits model weights from trainer ranks to inference ranks, moving only the regions each\n"
      "destination needs.\n\ncommands:\n");
  for (const Command& c : kCommands) std::printf("  %-6s %s\n", c.name, c.summary);
  std::printf("\n`reshard <command> --help` documents each command.\n"
              "Exit status: 0 success, 1 the operation failed, 2 invalid input or usage.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintHelp();
    return argc < 2 ? reshard::cli::kExitUsage : reshard::cli::kExitOk;
  }
  for (const Command& c : kCommands) {
    if (std::string_view(argv[1]) == c.name) return c.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "reshard: unknown command \"%s\" (see reshard --help)\n", argv[1]);
  return reshard::cli::kExitUsage;
}
