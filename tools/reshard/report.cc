#include "tools/reshard/report.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_format.h"

namespace reshard::cli {

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.2f %s", bytes, kUnits[u]);
}

std::string FormatSeconds(double s) {
  if (s >= 1) return absl::StrFormat("%.2f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.2f ms", s * 1e3);
  return absl::StrFormat("%.0f us", s * 1e6);
}

std::string FormatFingerprint(uint64_t fp) { return absl::StrFormat("0x%016x", fp); }

double Median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

double NearestRankPercentile(std::vector<double> samples, int percent) {
  if (samples.empty()) return 0;
  percent = std::clamp(percent, 1, 100);
  std::sort(samples.begin(), samples.end());
  // ceil(percent * n / 100) in integers: 0.9 * 10 must give rank 9, not 10.
  const size_t rank = (static_cast<size_t>(percent) * samples.size() + 99) / 100;
  return samples[rank - 1];
}

std::string Table::Render() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto numeric = [](const std::string& s) {
    return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-');
  };
  std::string out;
  for (size_t r = 0; r < rows_.size(); ++r) {
    const auto& row = rows_[r];
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = width[c] - row[c].size();
      if (c) line += "  ";
      if (r > 0 && c > 0 && numeric(row[c])) {
        line += std::string(pad, ' ') + row[c];
      } else {
        line += row[c] + (c + 1 < row.size() ? std::string(pad, ' ') : "");
      }
    }
    out += line + "\n";
    if (r == 0) {
      size_t total = 0;
      for (size_t c = 0; c < width.size(); ++c) total += width[c] + (c ? 2 : 0);
      out += std::string(total, '-') + "\n";
    }
  }
  return out;
}

}  // namespace reshard::cli
