#include "client/cli/table.h"

#include <algorithm>
#include <utility>

namespace tessera {
namespace cli {

size_t DisplayWidth(absl::string_view s) {
  size_t width = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++width;
  }
  return width;
}

Table::Table(std::vector<std::string> headers)
    : headers_(std::move(headers)), right_(headers_.size(), false) {}

void Table::AlignRight(size_t column) {
  if (column < right_.size()) right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::ostream& out, absl::string_view indent) const {
  const size_t n = headers_.size();
  std::vector<size_t> widths(n, 0);
  for (size_t c = 0; c < n; ++c) widths[c] = DisplayWidth(headers_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < n; ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  auto print_line = [&](const std::vector<std::string>& cells) {
    std::string line(indent);
    // The last column with content: nothing after it is printed, so no trailing spaces.
    size_t last = n;
    while (last > 0 && cells[last - 1].empty()) --last;
    for (size_t c = 0; c < last; ++c) {
      if (c > 0) line += "  ";
      size_t pad = widths[c] - DisplayWidth(cells[c]);
      if (right_[c]) {
        line.append(pad, ' ');
        line += cells[c];
      } else {
        line += cells[c];
        if (c + 1 < last) line.append(pad, ' ');
      }
    }
    out << line << '\n';
  };
  print_line(headers_);
  for (const auto& row : rows_) print_line(row);
}

}  // namespace cli
}  // namespace tessera
