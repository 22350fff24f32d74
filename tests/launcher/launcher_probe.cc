// A rank program for the launcher tests. Connects to the launcher's store, swaps its rank with
// every other rank, and prints one JSON line describing what it saw: its environment, its
// network namespace and the addresses of its interfaces.
//   launcher_probe [--fail-rank R] [--hang] [--hang-rank R]
// --fail-rank R: rank R exits with status 3 right after the exchange.
// --hang / --hang-rank R: sleep (forever, or only rank R) after printing, until killed.
#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/json.h"
#include "src/rendezvous/tcp_store.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int main(int argc, char** argv) {
  int fail_rank = -1;
  int hang_rank = -2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fail-rank") == 0 && i + 1 < argc) fail_rank = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--hang") == 0) hang_rank = -1;
    else if (std::strcmp(argv[i], "--hang-rank") == 0 && i + 1 < argc) hang_rank = std::atoi(argv[++i]);
  }
  const int rank = std::atoi(Env("RESHARD_RANK").c_str());
  const int world = std::atoi(Env("RESHARD_WORLD_SIZE").c_str());
  std::string exchange = "ok";
  auto store = reshard::rendezvous::ConnectStoreFromEnv();
  if (!store.ok()) {
    exchange = std::string(store.status().message());
  } else {
    absl::Status s = (*store)->Set(absl::StrCat("probe/", rank), absl::StrCat(getpid()));
    for (int r = 0; s.ok() && r < world; ++r) {
      s = (*store)->Get(absl::StrCat("probe/", r), absl::Now() + absl::Seconds(20)).status();
    }
    if (!s.ok()) exchange = std::string(s.message());
  }
  char ns[256] = {0};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n < 0) ns[0] = 0;
  std::string addrs;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) == 0) {
    for (ifaddrs* i = ifa; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      char buf[64];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
      absl::StrAppend(&addrs, addrs.empty() ? "" : ",", i->ifa_name, "=", buf);
    }
    freeifaddrs(ifa);
  }
  std::string slow_start_after_idle;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_slow_start_after_idle", "r")) {
    int c;
    while ((c = std::fgetc(f)) != EOF && c != '\n') slow_start_after_idle.push_back(static_cast<char>(c));
    std::fclose(f);
  }
  using reshard::json::Quote;
  std::printf("starting up\n{\"rank\":%d,\"world\":%d,\"exchange\":%s,\"netns\":%s,"
              "\"addrs\":%s,\"ucx_tls\":%s,\"ucx_net_devices\":%s,\"timeout_ms\":%s,"
              "\"token\":%s,\"store\":%s,\"slow_start_after_idle\":%s,\"local_rank\":%s}\n",
              rank, world, Quote(exchange).c_str(), Quote(ns).c_str(), Quote(addrs).c_str(),
              Quote(Env("UCX_TLS")).c_str(), Quote(Env("UCX_NET_DEVICES")).c_str(),
              Quote(Env("RESHARD_TIMEOUT_MS")).c_str(), Quote(Env("RESHARD_STORE_TOKEN")).c_str(),
              Quote(Env("RESHARD_STORE")).c_str(), Quote(slow_start_after_idle).c_str(),
              Quote(Env("RESHARD_LOCAL_RANK")).c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "probe rank %d done\n", rank);
  if (rank == fail_rank) return 3;
  if (hang_rank == -1 || hang_rank == rank) {
    while (true) pause();
  }
  return exchange == "ok" ? 0 : 1;
}
