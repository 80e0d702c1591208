// Table: an aligned text table for the CLI's human output.
//
//   RANK  COORDS          REACHED     WRITTEN
//   0     pp=0,tp=0,dp=0  PERSISTING  1.5 GiB
//
// Columns are separated by two spaces and padded to their widest cell, measured in UTF-8
// code points (fqns may be non-ASCII); right-aligned columns suit numbers. No line has
// trailing spaces.
//
// Lifecycle: build with headers, add rows, Print any number of times.
// Thread-safety: a value type; not safe for concurrent mutation.
#ifndef TESSERA_CLIENT_CLI_TABLE_H_
#define TESSERA_CLIENT_CLI_TABLE_H_

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tessera {
namespace cli {

class Table {
 public:
  explicit Table(std::vector<std::string> headers);

  // Right-aligns column `column` (header included). Out-of-range columns are ignored.
  void AlignRight(size_t column);

  // Adds a row. Missing trailing cells are empty; cells beyond the headers are dropped.
  void AddRow(std::vector<std::string> cells);

  size_t rows() const { return rows_.size(); }

  // Writes the header line and every row, each followed by '\n'. `indent` precedes each line.
  void Print(std::ostream& out, absl::string_view indent = "") const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of `s`: its UTF-8 code points (continuation bytes are not counted).
size_t DisplayWidth(absl::string_view s);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_TABLE_H_
