// Formatting helpers for human-readable reports: byte sizes, durations and aligned tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace reshard::cli {

// "1.50 MiB", "512 B".
std::string FormatBytes(double bytes);
// "12.3 ms", "1.20 s", "850 us".
std::string FormatSeconds(double seconds);
// "0x0123456789abcdef".
std::string FormatFingerprint(uint64_t fp);

// A text table: the first row is the header; numeric-looking cells are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace reshard::cli
