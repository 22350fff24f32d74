// `reshard info [--json]`: what this machine offers for refits, as the library probes it
// (reshard::ProbeSystem, reshard/system.h): UCX (version, the library actually loaded,
// transports and devices, memory types), CUDA devices, NCCL, RDMA NICs.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "reshard/system.h"
#include "src/common/json.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"

namespace reshard::cli {
namespace {

constexpr char kHelp[] = R"(usage: reshard info [--json]

Prints what this machine offers for refits:
  UCX        version loaded and version built against, the libucp that was loaded,
             transports and devices (with UCX_TLS and UCX_NET_DEVICES as set in the
             environment), memory types UCX can register, and so whether GPU buffers are
             registered directly or staged through pinned host memory
  CUDA       devices found through libcudart (dlopen; none when absent or on error)
  NCCL       version of libnccl (dlopen), or absent
  RDMA NICs  devices from libibverbs (dlopen) with port state, link layer and rate from sysfs

options:
  --json   one JSON object with the same facts
  --help   this text
)";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int InfoCommand(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", kHelp);
      return kExitOk;
    }
  }
  absl::StatusOr<Args> args = Args::Parse(argc, argv, {"json"}, {});
  if (!args.ok()) return UsageError("info", std::string(args.status().message()));
  if (!args->positional().empty()) return UsageError("info", "takes no positional arguments");

  const SystemInfo system = ProbeSystem();
  const UcxInfo& ucx = system.ucx;
  const CudaInfo& cuda = system.cuda;
  const NcclInfo& nccl = system.nccl;
  const RdmaInfo& rdma = system.rdma;

  std::vector<std::string> transports;
  std::set<std::string> seen;
  for (const auto& [tl, dev] : ucx.resources) {
    if (seen.insert(tl).second) transports.push_back(tl);
  }

  if (args->Has("json")) {
    using json::Quote;
    std::vector<std::string> res, mem, buses, nics;
    for (const auto& [tl, dev] : ucx.resources) {
      res.push_back(absl::StrCat("{\"transport\":", Quote(tl), ",\"device\":", Quote(dev), "}"));
    }
    for (const auto& m : ucx.memory_types) mem.push_back(Quote(m));
    for (const auto& b : cuda.pci_bus_ids) buses.push_back(Quote(b));
    for (const auto& nic : rdma.nics) {
      std::vector<std::string> ports;
      for (const auto& p : nic.ports) {
        ports.push_back(absl::StrCat("{\"port\":", Quote(p.port), ",\"state\":", Quote(p.state),
                                     ",\"link_layer\":", Quote(p.link_layer),
                                     ",\"rate\":", Quote(p.rate), "}"));
      }
      nics.push_back(absl::StrCat("{\"name\":", Quote(nic.name),
                                  ",\"numa_node\":", Quote(nic.numa_node), ",\"ports\":[",
                                  absl::StrJoin(ports, ","), "]}"));
    }
    std::vector<std::string> tl_quoted;
    for (const auto& t : transports) tl_quoted.push_back(Quote(t));
    std::printf(
        "{\"ucx\":{\"version\":%s,\"built_against\":%s,\"version_warning\":%s,"
        "\"library\":%s,\"error\":%s,\"ucx_tls\":%s,"
        "\"ucx_net_devices\":%s,\"transports\":[%s],\"resources\":[%s],\"memory_types\":[%s],"
        "\"cuda_memory\":%s},"
        "\"cuda\":{\"library\":%s,\"runtime_version\":%s,\"devices\":%d,\"pci_bus_ids\":[%s],"
        "\"why_none\":%s},"
        "\"nccl\":{\"library\":%s,\"version\":%s,\"why_none\":%s},"
        "\"rdma\":{\"nics\":[%s],\"why_none\":%s}}\n",
        Quote(ucx.version).c_str(), Quote(ucx.built_against).c_str(),
        Quote(ucx.version_warning).c_str(), Quote(ucx.library).c_str(), Quote(ucx.error).c_str(),
        Quote(Env("UCX_TLS")).c_str(), Quote(Env("UCX_NET_DEVICES")).c_str(),
        absl::StrJoin(tl_quoted, ",").c_str(), absl::StrJoin(res, ",").c_str(),
        absl::StrJoin(mem, ",").c_str(),
        Quote(ucx.registers_cuda_memory ? "registered" : "staged").c_str(),
        Quote(cuda.library).c_str(),
        Quote(cuda.runtime_version).c_str(), cuda.devices, absl::StrJoin(buses, ",").c_str(),
        Quote(cuda.why_none).c_str(), Quote(nccl.library).c_str(), Quote(nccl.version).c_str(),
        Quote(nccl.why_none).c_str(), absl::StrJoin(nics, ",").c_str(),
        Quote(rdma.why_none).c_str());
    return kExitOk;
  }

  std::printf("UCX\n  version       %s (built against %s)\n  library       %s\n",
              ucx.version.c_str(), ucx.built_against.c_str(),
              ucx.library.empty() ? "(unknown)" : ucx.library.c_str());
  if (!ucx.version_warning.empty()) std::printf("  warning       %s\n", ucx.version_warning.c_str());
  if (!Env("UCX_TLS").empty() || !Env("UCX_NET_DEVICES").empty()) {
    std::printf("  environment   UCX_TLS=%s UCX_NET_DEVICES=%s\n", Env("UCX_TLS").c_str(),
                Env("UCX_NET_DEVICES").c_str());
  }
  if (!ucx.error.empty()) std::printf("  error         %s\n", ucx.error.c_str());
  std::printf("  transports    %s\n",
              transports.empty() ? "(none)" : absl::StrJoin(transports, ", ").c_str());
  for (const auto& tl : transports) {
    std::vector<std::string> devs;
    for (const auto& [t, d] : ucx.resources) {
      if (t == tl) devs.push_back(d);
    }
    std::printf("    %-10s  %s\n", tl.c_str(), absl::StrJoin(devs, ", ").c_str());
  }
  std::printf("  memory types  %s\n", absl::StrJoin(ucx.memory_types, ", ").c_str());
  std::printf("  CUDA memory   %s\n",
              ucx.registers_cuda_memory
                  ? "registered by UCX: GPU buffers are put directly"
                  : "not registrable by this UCX: GPU buffers are staged through pinned host "
                    "memory");
  std::printf("CUDA\n");
  if (cuda.devices > 0) {
    std::printf("  devices       %d (%s)\n  runtime       %s (%s)\n", cuda.devices,
                absl::StrJoin(cuda.pci_bus_ids, ", ").c_str(), cuda.runtime_version.c_str(),
                cuda.library.c_str());
  } else {
    std::printf("  devices       none: %s\n", cuda.why_none.c_str());
    if (!cuda.runtime_version.empty()) {
      std::printf("  runtime       %s (%s)\n", cuda.runtime_version.c_str(), cuda.library.c_str());
    }
  }
  std::printf("NCCL\n");
  if (!nccl.version.empty()) {
    std::printf("  version       %s (%s)\n", nccl.version.c_str(), nccl.library.c_str());
  } else {
    std::printf("  absent        %s\n", nccl.why_none.c_str());
  }
  std::printf("RDMA NICs\n");
  if (rdma.nics.empty()) {
    std::printf("  none          %s\n", rdma.why_none.c_str());
  } else {
    for (const auto& nic : rdma.nics) {
      std::printf("  %-12s  numa node %s\n", nic.name.c_str(), nic.numa_node.c_str());
      for (const auto& p : nic.ports) {
        std::printf("    port %s  %s  %s  %s\n", p.port.c_str(), p.state.c_str(),
                    p.link_layer.c_str(), p.rate.c_str());
      }
    }
  }
  return kExitOk;
}

}  // namespace reshard::cli
