// Helpers for reports: byte sizes, durations, aligned tables, and the statistics of timing
// samples that `reshard run` and `reshard bench` both print.
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

// The median of `samples`: the middle one, or the mean of the two middle ones for an even count;
// 0 when empty.
double Median(std::vector<double> samples);
// The `percent`-th percentile (1..100) by the nearest-rank method: the smallest sample with at
// least `percent`% of the samples at or below it, i.e. the ceil(percent/100 * n)-th smallest.
// Always one of the samples, never interpolated: p90 of fewer than 10 samples is the largest,
// of 10..19 samples the second largest. 0 when empty.
double NearestRankPercentile(std::vector<double> samples, int percent);

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
