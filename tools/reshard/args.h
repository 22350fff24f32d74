// Minimal argument parsing for subcommands: `--flag`, `--key value` and `--key=value`, short
// aliases of options (`-o FILE` for `--output FILE`), plus positional arguments. Unknown flags
// are errors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard::cli {

class Args {
 public:
  // `flags` take no value; `options` take one. Both are given without the leading "--".
  // `short_options` maps a one-letter alias ("o") to an option of `options` ("output"); the
  // alias takes its value from the next argument.
  [[nodiscard]] static absl::StatusOr<Args> Parse(
      int argc, char** argv, const std::set<std::string>& flags,
      const std::set<std::string>& options,
      const std::map<std::string, std::string>& short_options = {});

  bool Has(const std::string& name) const { return present_.count(name) > 0; }
  std::optional<std::string> Get(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  [[nodiscard]] absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::set<std::string> present_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Prints "reshard <command>: <message>" on stderr and returns kExitUsage.
int UsageError(const char* command, const std::string& message);

}  // namespace reshard::cli
