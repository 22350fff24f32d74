// Runs a fuzz harness once over every file of the given corpus directories (or files), without
// libFuzzer: so every build, gcc included, exercises the checked-in corpus and regressions.
//
//   <harness>_replay [--optional] PATH...
//
// Every PATH must exist, except those after --optional (a harness without regressions yet).
// A harness reports a finding by aborting (RESHARD_CHECK, a sanitizer), which fails the test;
// the name of the file being run is printed first so the failing input is known. Exit status 0
// when every input ran, 2 on a usage or I/O error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

namespace fs = std::filesystem;

bool ReadFile(const fs::path& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> inputs;
  bool optional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--optional") {
      optional = true;
      continue;
    }
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (auto it = fs::recursive_directory_iterator(arg, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file()) inputs.push_back(it->path());
      }
      if (ec) {
        std::fprintf(stderr, "%s: %s: %s\n", argv[0], arg.c_str(), ec.message().c_str());
        return 2;
      }
    } else if (fs::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    } else if (!optional) {
      std::fprintf(stderr, "%s: %s is neither a file nor a directory\n", argv[0], arg.c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs (usage: %s [--optional] PATH...)\n", argv[0], argv[0]);
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  std::vector<uint8_t> bytes;
  for (const fs::path& path : inputs) {
    if (!ReadFile(path, &bytes)) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], path.c_str());
      return 2;
    }
    std::fprintf(stderr, "running %s (%zu bytes)\n", path.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::fprintf(stderr, "%zu inputs ran\n", inputs.size());
  return 0;
}
