// `reshard spec --model M.json --train P --infer P [--cluster C.json] [--per-expert]
//  [-o FILE]`: the refit spec of a model, as JSON that `reshard plan`, `run` and `bench` read.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "src/plan/spec_json.h"
#include "tools/reshard/args.h"
#include "tools/reshard/commands.h"
#include "tools/reshard/model_args.h"

namespace reshard::cli {
namespace {

constexpr char kHelpHead[] =
    R"(usage: reshard spec --model M.json --train P --infer P [options] [-o FILE]

Writes the refit spec of a Hugging Face model as JSON (docs/spec-format.md): every parameter with
its trainer layout (Megatron) and its inference layout (vLLM, fused buffers as views), and the
topology. It is the spec `reshard sim` and `reshard bench --model` generate; `reshard plan`,
`reshard run` and `reshard bench` read it. The output is a deterministic function of the
arguments.

options:
)";

constexpr char kHelpTail[] =
    R"(  --cluster C.json   NVLink domains, GPUs per node and bandwidths of the topology (default: one
                     domain per inference TP group, as `reshard bench --model` uses)
  -o, --output FILE  write the spec to FILE instead of standard output
  --help             this text

exit status: 0 success, 1 FILE could not be written, 2 invalid input or usage.
)";

// Writes `text` to `path` whole; false with errno set when any step fails.
bool WriteFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written) errno = write_errno;
  return written && closed;
}

}  // namespace

int SpecCommand(int argc, char** argv) {
  std::set<std::string> options = ModelOptions();
  options.insert("output");
  std::set<std::string> flags = ModelFlags();
  flags.insert("help");
  auto parsed = Args::Parse(argc, argv, flags, options, {{"o", "output"}});
  if (!parsed.ok()) return UsageError("spec", std::string(parsed.status().message()));
  const Args& args = *parsed;
  if (args.Has("help")) {
    std::printf("%s%s%s", kHelpHead, kModelOptionsHelp, kHelpTail);
    return kExitOk;
  }
  if (!args.positional().empty()) {
    return UsageError("spec", "takes no positional arguments (see --help)");
  }
  auto made = ModelSpecFromArgs(args, ClusterDefault::kDomainPerInferenceTp);
  if (!made.ok()) return UsageError("spec", std::string(made.status().message()));
  const std::string text = plan::SpecToJson(made->spec);
  const auto output = args.Get("output");
  if (!output || *output == "-") {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout)) {
      std::fprintf(stderr, "reshard spec: cannot write the spec to standard output: %s\n",
                   std::strerror(errno));
      return kExitFailed;
    }
    return kExitOk;
  }
  if (!WriteFile(*output, text)) {
    std::fprintf(stderr, "reshard spec: cannot write %s: %s\n", output->c_str(),
                 std::strerror(errno));
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace reshard::cli
