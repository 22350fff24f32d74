// `reshard store --listen HOST:PORT [--ready-file FILE]`: the rendezvous store as a process of
// its own, for jobs whose launcher is not `reshard run` (mpirun across hosts, Slurm): ranks
// reach it with RESHARD_STORE=HOST:PORT and the same RESHARD_STORE_TOKEN, and no trainer
// process has to serve it (a trainer that stops or dies would take the store with it).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "reshard/launch.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"

namespace reshard::cli {
namespace {

constexpr char kHelp[] = R"(usage: reshard store --listen HOST:PORT [--ready-file FILE]

Serves the rendezvous store until SIGINT or SIGTERM. Clients must present the token in
RESHARD_STORE_TOKEN (read from the environment, never from the command line, where other users
could read it); ranks connect with RESHARD_STORE=HOST:PORT and the same token.

options:
  --listen HOST:PORT  address to bind: an interface address, 127.0.0.1 for this host only,
                      0.0.0.0 for every interface; PORT 0 picks a free port
  --ready-file FILE   once listening, write "HOST:PORT" (the port actually bound) to FILE
  --help              this text

Prints one line when listening and one when it stops (clients turned away).
Exit status: 0 stopped by a signal, 1 cannot serve, 2 usage.
)";

}  // namespace

int StoreCommand(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", kHelp);
      return kExitOk;
    }
  }
  absl::StatusOr<Args> args = Args::Parse(argc, argv, {}, {"listen", "ready-file"});
  if (!args.ok()) return UsageError("store", std::string(args.status().message()));
  if (!args->positional().empty()) return UsageError("store", "takes no positional arguments");
  const std::optional<std::string> listen = args->Get("listen");
  if (!listen) return UsageError("store", "--listen HOST:PORT is required");
  const size_t colon = listen->rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen->substr(colon + 1), &port) || port < 0 || port > 65535) {
    return UsageError("store", absl::StrCat("--listen \"", *listen, "\" is not HOST:PORT"));
  }
  const std::string host = listen->substr(0, colon);
  const char* token = std::getenv("RESHARD_STORE_TOKEN");
  if (token == nullptr || *token == '\0') {
    return UsageError("store", "RESHARD_STORE_TOKEN is not set; clients must present a secret");
  }
  // Block the stop signals before any thread starts, so that sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  absl::StatusOr<std::unique_ptr<StoreServer>> server = StoreServer::Start(host, port, token);
  if (!server.ok()) {
    std::fprintf(stderr, "reshard store: %s\n", std::string(server.status().message()).c_str());
    return kExitFailed;
  }
  const std::string address = absl::StrCat(host, ":", (*server)->port());
  if (const std::optional<std::string> ready = args->Get("ready-file")) {
    const std::string tmp = *ready + ".tmp";
    std::ofstream(tmp) << address << "\n";
    if (std::rename(tmp.c_str(), ready->c_str()) != 0) {
      std::fprintf(stderr, "reshard store: cannot write --ready-file %s\n", ready->c_str());
      return kExitFailed;
    }
  }
  std::printf("reshard store: serving on %s\n", address.c_str());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop, &signal);
  std::printf("reshard store: stopped by signal %d (%lld client(s) turned away)\n", signal,
              static_cast<long long>((*server)->refused()));
  return kExitOk;
}

}  // namespace reshard::cli
