#include "tools/reshard/args.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/reshard/commands.h"

namespace reshard::cli {

absl::StatusOr<Args> Args::Parse(int argc, char** argv, const std::set<std::string>& flags,
                                 const std::set<std::string>& options,
                                 const std::map<std::string, std::string>& short_options) {
  Args args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const auto alias =
        a.size() == 2 && a[0] == '-' ? short_options.find(a.substr(1)) : short_options.end();
    if (alias != short_options.end()) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      args.present_.insert(alias->second);
      args.values_[alias->second] = argv[++i];
      continue;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      args.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (flags.count(name)) {
      if (value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      args.present_.insert(name);
    } else if (options.count(name)) {
      if (!value) {
        if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      args.present_.insert(name);
      args.values_[name] = *value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name, " (see --help)"));
    }
  }
  return args;
}

std::optional<std::string> Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback) const {
  auto v = Get(name);
  if (!v) return fallback;
  int64_t out;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer, not \"", *v, "\""));
  }
  return out;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback) const {
  auto v = Get(name);
  if (!v) return fallback;
  double out;
  if (!absl::SimpleAtod(*v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be a number, not \"", *v, "\""));
  }
  return out;
}

int UsageError(const char* command, const std::string& message) {
  std::fprintf(stderr, "reshard %s: %s\n", command, message.c_str());
  return kExitUsage;
}

}  // namespace reshard::cli
