#include "reshard/system.h"

#include <dirent.h>
#include <dlfcn.h>
#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace reshard {
namespace {

UcxInfo ProbeUcx() {
  UcxInfo info;
  info.version = ucp_get_version_string();
  info.built_against = absl::StrCat(UCP_API_MAJOR, ".", UCP_API_MINOR);
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (major != UCP_API_MAJOR || minor < UCP_API_MINOR) {
    info.version_warning = absl::StrCat("the loaded UCX ", major, ".", minor,
                                        " is older than the headers reshard was built with (",
                                        info.built_against, "); check LD_LIBRARY_PATH");
  }
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
    info.registers_cuda_memory = (attr.memory_types & (1ull << UCS_MEMORY_TYPE_CUDA)) != 0;
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

CudaInfo ProbeCuda() {
  CudaInfo info;
  std::string error;
  void* h = OpenFirst(
      {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so"},
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
    info.why_none =
        "ibv_get_device_list failed: this machine has no RDMA devices (no "
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
        nic.ports.push_back(
            {p, ReadSysfs(pb + "/state"), ReadSysfs(pb + "/link_layer"), ReadSysfs(pb + "/rate")});
      }
      closedir(d);
    }
    info.nics.push_back(std::move(nic));
  }
  free_list(devices);
  if (info.nics.empty()) info.why_none = "ibv_get_device_list found no RDMA devices";
  return info;
}

}  // namespace

SystemInfo ProbeSystem() { return SystemInfo{ProbeUcx(), ProbeCuda(), ProbeNccl(), ProbeRdma()}; }

}  // namespace reshard
