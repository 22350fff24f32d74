// `reshard info [--json]`: what this machine offers for refits. UCX (version, the library actually
// loaded, transports and devices, memory types), CUDA devices, NCCL, RDMA NICs.
//
// CUDA, NCCL and libibverbs are opened with dlopen so the CLI starts on machines without them
// (and never links libcuda); every probe failure becomes a sentence, never a crash.
#include <dirent.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "src/common/json.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"

namespace reshard::cli {
namespace {

constexpr char kHelp[] = R"(usage: reshard info [--json]

Prints what this machine offers for refits:
  UCX        version, the libucp that was loaded, transports and devices (with UCX_TLS and
             UCX_NET_DEVICES as set in the environment), memory types UCX can register
  CUDA       devices found through libcudart (dlopen; none when absent or on error)
  NCCL       version of libnccl (dlopen), or absent
  RDMA NICs  devices from libibverbs (dlopen) with port state, link layer and rate from sysfs

options:
  --json   one JSON object with the same facts
  --help   this text
)";

struct UcxInfo {
  std::string version;
  std::string library;
  std::string error;
  std::vector<std::pair<std::string, std::string>> resources;  // transport, device
  std::vector<std::string> memory_types;
};

UcxInfo ProbeUcx() {
  UcxInfo info;
  info.version = ucp_get_version_string();
  Dl_info dl{};
  if (dladdr(reinterpret_cast<void*>(&ucp_get_version_string), &dl) != 0 && dl.dli_fname) {
    char* real = realpath(dl.dli_fname, nullptr);
    info.library = real ? real : dl.dli_fname;
    std::free(real);
  }
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    info.error = absl::StrCat("ucp_config_read: ", ucs_status_string(status));
    return info;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    info.error = absl::StrCat("ucp_init: ", ucs_status_string(status));
    return info;
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context, &attr) == UCS_OK) {
    for (int t = 0; t < UCS_MEMORY_TYPE_LAST; ++t) {
      if (attr.memory_types & (1ull << t)) info.memory_types.push_back(ucs_memory_type_names[t]);
    }
  }
  // The resource lines of ucp_context_print_info: "#  resource 1  :  md 1  dev 1  flags -- tcp/lo".
  char* text = nullptr;
  size_t size = 0;
  if (FILE* f = open_memstream(&text, &size)) {
    ucp_context_print_info(context, f);
    std::fclose(f);
    for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
      if (line.find("resource") == absl::string_view::npos) continue;
      size_t dashes = line.find("-- ");
      if (dashes == absl::string_view::npos) continue;
      std::string tl_dev(absl::StripAsciiWhitespace(line.substr(dashes + 3)));
      size_t slash = tl_dev.find('/');
      if (slash == std::string::npos) continue;
      info.resources.emplace_back(tl_dev.substr(0, slash), tl_dev.substr(slash + 1));
    }
    std::free(text);
  }
  ucp_cleanup(context);
  return info;
}

void* OpenFirst(const std::vector<std::string>& names, std::string* opened, std::string* error) {
  for (const std::string& name : names) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *opened = name;
      return h;
    }
    *error = dlerror();
  }
  return nullptr;
}

struct CudaInfo {
  std::string library;
  std::string runtime_version;
  int devices = 0;
  std::vector<std::string> pci_bus_ids;
  std::string why_none;
};

CudaInfo ProbeCuda() {
  CudaInfo info;
  std::string error;
  void* h = OpenFirst({"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                       "/usr/local/cuda/lib64/libcudart.so"},
                      &info.library, &error);
  if (h == nullptr) {
    info.why_none = absl::StrCat("libcudart cannot be loaded (", error, ")");
    return info;
  }
  using CountFn = int (*)(int*);
  using VersionFn = int (*)(int*);
  using ErrorFn = const char* (*)(int);
  using BusFn = int (*)(char*, int, int);
  auto count = reinterpret_cast<CountFn>(dlsym(h, "cudaGetDeviceCount"));
  auto version = reinterpret_cast<VersionFn>(dlsym(h, "cudaRuntimeGetVersion"));
  auto error_string = reinterpret_cast<ErrorFn>(dlsym(h, "cudaGetErrorString"));
  auto bus_id = reinterpret_cast<BusFn>(dlsym(h, "cudaDeviceGetPCIBusId"));
  int v = 0;
  if (version && version(&v) == 0) {
    info.runtime_version = absl::StrCat(v / 1000, ".", (v % 1000) / 10);
  }
  if (count == nullptr) {
    info.why_none = "libcudart has no cudaGetDeviceCount";
    return info;
  }
  int n = 0;
  int rc = count(&n);
  if (rc != 0) {
    info.why_none = absl::StrCat("cudaGetDeviceCount failed with error ", rc,
                                 error_string ? absl::StrCat(" (", error_string(rc), ")") : "");
    return info;
  }
  if (n == 0) {
    info.why_none = "cudaGetDeviceCount found 0 devices";
    return info;
  }
  info.devices = n;
  for (int d = 0; d < n; ++d) {
    char bus[64] = {0};
    if (bus_id && bus_id(bus, sizeof(bus), d) == 0) info.pci_bus_ids.push_back(bus);
  }
  return info;  // The library stays loaded; dlclose on a CUDA runtime is not worth the risk.
}

struct NcclInfo {
  std::string library;
  std::string version;
  std::string why_none;
};

NcclInfo ProbeNccl() {
  NcclInfo info;
  std::string error;
  void* h = OpenFirst({"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"},
                      &info.library, &error);
  if (h == nullptr) {
    info.why_none = absl::StrCat("libnccl cannot be loaded (", error, ")");
    return info;
  }
  using VersionFn = int (*)(int*);
  auto get = reinterpret_cast<VersionFn>(dlsym(h, "ncclGetVersion"));
  int v = 0;
  if (get == nullptr || get(&v) != 0) {
    info.why_none = "ncclGetVersion failed";
    return info;
  }
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before.
  if (v >= 10000) {
    info.version = absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  } else {
    info.version = absl::StrCat(v / 1000, ".", (v % 1000) / 100, ".", v % 100);
  }
  return info;
}

struct RdmaPort {
  std::string port, state, link_layer, rate;
};
struct RdmaNic {
  std::string name;
  std::string numa_node;
  std::vector<RdmaPort> ports;
};
struct RdmaInfo {
  std::vector<RdmaNic> nics;
  std::string why_none;
};

std::string ReadSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

RdmaInfo ProbeRdma() {
  RdmaInfo info;
  std::string opened, error;
  void* h = OpenFirst({"libibverbs.so.1", "libibverbs.so"}, &opened, &error);
  if (h == nullptr) {
    info.why_none = absl::StrCat("libibverbs cannot be loaded (", error, "), so no RDMA NICs");
    return info;
  }
  using ListFn = void** (*)(int*);
  using FreeFn = void (*)(void**);
  using NameFn = const char* (*)(void*);
  auto list = reinterpret_cast<ListFn>(dlsym(h, "ibv_get_device_list"));
  auto free_list = reinterpret_cast<FreeFn>(dlsym(h, "ibv_free_device_list"));
  auto name = reinterpret_cast<NameFn>(dlsym(h, "ibv_get_device_name"));
  if (!list || !free_list || !name) {
    info.why_none = "libibverbs lacks ibv_get_device_list";
    return info;
  }
  int n = 0;
  void** devices = list(&n);
  if (devices == nullptr) {
    info.why_none = "ibv_get_device_list failed: this machine has no RDMA devices (no "
                    "InfiniBand/RoCE driver loaded)";
    return info;
  }
  for (int i = 0; i < n; ++i) {
    RdmaNic nic;
    nic.name = name(devices[i]);
    const std::string base = absl::StrCat("/sys/class/infiniband/", nic.name);
    nic.numa_node = ReadSysfs(base + "/device/numa_node");
    if (DIR* d = opendir((base + "/ports").c_str())) {
      while (dirent* e = readdir(d)) {
        std::string p = e->d_name;
        if (p == "." || p == "..") continue;
        const std::string pb = absl::StrCat(base, "/ports/", p);
        nic.ports.push_back({p, ReadSysfs(pb + "/state"), ReadSysfs(pb + "/link_layer"),
                             ReadSysfs(pb + "/rate")});
      }
      closedir(d);
    }
    info.nics.push_back(std::move(nic));
  }
  free_list(devices);
  if (info.nics.empty()) info.why_none = "ibv_get_device_list found no RDMA devices";
  return info;
}

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

  const UcxInfo ucx = ProbeUcx();
  const CudaInfo cuda = ProbeCuda();
  const NcclInfo nccl = ProbeNccl();
  const RdmaInfo rdma = ProbeRdma();

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
      nics.push_back(absl::StrCat("{\"name\":", Quote(nic.name), ",\"numa_node\":",
                                  Quote(nic.numa_node), ",\"ports\":[", absl::StrJoin(ports, ","),
                                  "]}"));
    }
    std::vector<std::string> tl_quoted;
    for (const auto& t : transports) tl_quoted.push_back(Quote(t));
    std::printf(
        "{\"ucx\":{\"version\":%s,\"library\":%s,\"error\":%s,\"ucx_tls\":%s,"
        "\"ucx_net_devices\":%s,\"transports\":[%s],\"resources\":[%s],\"memory_types\":[%s]},"
        "\"cuda\":{\"library\":%s,\"runtime_version\":%s,\"devices\":%d,\"pci_bus_ids\":[%s],"
        "\"why_none\":%s},"
        "\"nccl\":{\"library\":%s,\"version\":%s,\"why_none\":%s},"
        "\"rdma\":{\"nics\":[%s],\"why_none\":%s}}\n",
        Quote(ucx.version).c_str(), Quote(ucx.library).c_str(), Quote(ucx.error).c_str(),
        Quote(Env("UCX_TLS")).c_str(), Quote(Env("UCX_NET_DEVICES")).c_str(),
        absl::StrJoin(tl_quoted, ",").c_str(), absl::StrJoin(res, ",").c_str(),
        absl::StrJoin(mem, ",").c_str(), Quote(cuda.library).c_str(),
        Quote(cuda.runtime_version).c_str(), cuda.devices, absl::StrJoin(buses, ",").c_str(),
        Quote(cuda.why_none).c_str(), Quote(nccl.library).c_str(), Quote(nccl.version).c_str(),
        Quote(nccl.why_none).c_str(), absl::StrJoin(nics, ",").c_str(),
        Quote(rdma.why_none).c_str());
    return kExitOk;
  }

  std::printf("UCX\n  version       %s\n  library       %s\n", ucx.version.c_str(),
              ucx.library.empty() ? "(unknown)" : ucx.library.c_str());
  if (!Env("UCX_TLS").empty() || !Env("UCX_NET_DEVICES").empty()) {
    std::printf("  environment   UCX_TLS=%s UCX_NET_DEVICES=%s\n", Env("UCX_TLS").c_str(),
                Env("UCX_NET_DEVICES").c_str());
  }
  if (!ucx.error.empty()) std::printf("  error         %s\n", ucx.error.c_str());
  std::printf("  transports    %s\n", transports.empty() ? "(none)"
                                                         : absl::StrJoin(transports, ", ").c_str());
  for (const auto& tl : transports) {
    std::vector<std::string> devs;
    for (const auto& [t, d] : ucx.resources) {
      if (t == tl) devs.push_back(d);
    }
    std::printf("    %-10s  %s\n", tl.c_str(), absl::StrJoin(devs, ", ").c_str());
  }
  std::printf("  memory types  %s%s\n", absl::StrJoin(ucx.memory_types, ", ").c_str(),
              std::find(ucx.memory_types.begin(), ucx.memory_types.end(), "cuda") ==
                      ucx.memory_types.end()
                  ? "  (no CUDA memory: GPU buffers are staged through pinned host memory)"
                  : "  (CUDA memory is registered and put directly)");
  std::printf("CUDA\n");
  if (cuda.devices > 0) {
    std::printf("  devices       %d (%s)\n  runtime       %s (%s)\n", cuda.devices,
                absl::StrJoin(cuda.pci_bus_ids, ", ").c_str(), cuda.runtime_version.c_str(),
                cuda.library.c_str());
  } else {
    std::printf("  devices       none: %s\n", cuda.why_none.c_str());
    if (!cuda.runtime_version.empty()) {
      std::printf("  runtime       %s (%s)\n", cuda.runtime_version.c_str(),
                  cuda.library.c_str());
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
