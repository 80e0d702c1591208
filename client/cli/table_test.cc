#include "client/cli/table.h"

#include <sstream>

#include "gtest/gtest.h"

namespace tessera {
namespace cli {
namespace {

std::string Render(const Table& table, absl::string_view indent = "") {
  std::ostringstream out;
  table.Print(out, indent);
  return out.str();
}

TEST(Table, ColumnsPaddedToWidest_NoTrailingSpaces) {
  Table t({"RANK", "COORDS", "STATE"});
  t.AddRow({"0", "pp=0,tp=0", "PERSISTING"});
  t.AddRow({"12", "pp=1", "DONE"});
  EXPECT_EQ(Render(t),
            "RANK  COORDS     STATE\n"
            "0     pp=0,tp=0  PERSISTING\n"
            "12    pp=1       DONE\n");
}

TEST(Table, RightAlignedColumn_PadsOnTheLeft) {
  Table t({"KEY", "BYTES"});
  t.AlignRight(1);
  t.AlignRight(7);  // out of range: ignored
  t.AddRow({"a", "5 B"});
  t.AddRow({"bb", "1.5 KiB"});
  EXPECT_EQ(Render(t, "  "),
            "  KEY    BYTES\n"
            "  a        5 B\n"
            "  bb   1.5 KiB\n");
}

TEST(Table, MissingAndTrailingEmptyCells_Dropped) {
  Table t({"A", "B", "C"});
  t.AlignRight(2);
  t.AddRow({"x"});
  t.AddRow({"y", "", "z", "dropped"});
  EXPECT_EQ(t.rows(), 2u);
  EXPECT_EQ(Render(t),
            "A  B  C\n"
            "x\n"
            "y     z\n");
}

TEST(Table, NonAsciiCells_MeasuredInCodePoints) {
  Table t({"KEY", "N"});
  t.AddRow({"caf\xc3\xa9", "1"});  // 4 code points, 5 bytes
  t.AddRow({"abcde", "2"});
  EXPECT_EQ(Render(t),
            "KEY    N\n"
            "caf\xc3\xa9   1\n"
            "abcde  2\n");
  EXPECT_EQ(DisplayWidth("caf\xc3\xa9"), 4u);
}

}  // namespace
}  // namespace cli
}  // namespace tessera
