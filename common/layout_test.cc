#include "common/layout.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

v1::Layout MakeLayout(const std::vector<std::pair<std::string, uint32_t>>& dims) {
  v1::Layout layout;
  for (const auto& [name, degree] : dims) {
    v1::MeshDim* dim = layout.add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  return layout;
}

MeshLayout PpTpDp() {
  absl::StatusOr<MeshLayout> layout = MeshLayout::FromProto(MakeLayout({{"pp", 2}, {"tp", 2}, {"dp", 2}}));
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

TEST(MeshLayout, FromProto_Accessors) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(mesh.dim_count(), 3u);
  EXPECT_EQ(mesh.dim_name(0), "pp");
  EXPECT_EQ(mesh.dim_name(2), "dp");
  EXPECT_EQ(mesh.degree(1), 2u);
  EXPECT_EQ(mesh.world_size(), 8u);
  EXPECT_EQ(mesh.DimIndex("tp"), std::optional<size_t>(1));
  EXPECT_FALSE(mesh.DimIndex("cp").has_value());
  EXPECT_TRUE(mesh.SameMesh(mesh.proto()));
}

TEST(MeshLayout, RowMajorCoords_FirstDimOutermost) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(mesh.Coords(0), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(mesh.Coords(1), (std::vector<uint32_t>{0, 0, 1}));
  EXPECT_EQ(mesh.Coords(2), (std::vector<uint32_t>{0, 1, 0}));
  EXPECT_EQ(mesh.Coords(5), (std::vector<uint32_t>{1, 0, 1}));
  EXPECT_EQ(mesh.Coords(7), (std::vector<uint32_t>{1, 1, 1}));
}

TEST(MeshLayout, CoordsRank_RoundTrip) {
  for (const auto& dims : std::vector<std::vector<std::pair<std::string, uint32_t>>>{
           {{"pp", 2}, {"tp", 2}, {"dp", 2}},
           {{"pp", 3}, {"dp", 4}, {"tp", 5}},
           {{"dp", 1}},
           {{"dp", 7}},
           {{"a", 1}, {"b", 3}, {"c", 1}, {"d", 2}}}) {
    absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(MakeLayout(dims));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    for (uint32_t r = 0; r < mesh->world_size(); ++r) {
      std::vector<uint32_t> coords = mesh->Coords(r);
      ASSERT_EQ(coords.size(), dims.size());
      for (size_t i = 0; i < coords.size(); ++i) EXPECT_LT(coords[i], mesh->degree(i));
      absl::StatusOr<uint32_t> back = mesh->Rank(coords);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, r);
    }
  }
}

TEST(MeshLayout, Rank_BadCoords_Rejected) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(mesh.Rank(std::vector<uint32_t>{0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.Rank(std::vector<uint32_t>{0, 0, 0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<uint32_t> r = mesh.Rank(std::vector<uint32_t>{0, 2, 0});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tp"), absl::string_view::npos) << r.status();
}

TEST(MeshLayout, CoordString) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(mesh.CoordString(0), "pp=0,tp=0,dp=0");
  EXPECT_EQ(mesh.CoordString(5), "pp=1,tp=0,dp=1");
  EXPECT_EQ(mesh.CoordString(6), "pp=1,tp=1,dp=0");
}

TEST(MeshLayout, DimMask) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(*mesh.DimMask({}), 0u);
  EXPECT_EQ(*mesh.DimMask({"pp"}), 1u);
  EXPECT_EQ(*mesh.DimMask({"dp"}), 4u);
  EXPECT_EQ(*mesh.DimMask({"dp", "tp"}), 6u);
  EXPECT_EQ(*mesh.DimMask({"dp", "dp"}), 4u);
  EXPECT_EQ(*mesh.DimMask({"pp", "tp", "dp"}), 7u);
}

TEST(MeshLayout, DimMask_UnknownDim_Rejected) {
  MeshLayout mesh = PpTpDp();
  absl::StatusOr<uint64_t> mask = mesh.DimMask({"dp", "cp"});
  EXPECT_EQ(mask.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mask.status().message().find("cp"), absl::string_view::npos) << mask.status();
  EXPECT_FALSE(mesh.DimMask({""}).ok());
  EXPECT_FALSE(mesh.DimMask({"DP"}).ok());
}

std::vector<uint32_t> Members(const MeshLayout& mesh, uint32_t rank,
                              std::vector<std::string> dims) {
  absl::StatusOr<uint64_t> mask = mesh.DimMask(dims);
  EXPECT_TRUE(mask.ok()) << mask.status();
  return mesh.ReplicaGroupMembers(rank, *mask);
}

TEST(MeshLayout, ReplicaGroup_Dp) {
  MeshLayout mesh = PpTpDp();
  uint64_t dp = *mesh.DimMask({"dp"});
  // Ranks differing only in dp: (r, r ^ 1).
  for (uint32_t r = 0; r < 8; ++r) {
    EXPECT_EQ(mesh.ReplicaGroupKey(r, dp), r & ~1u) << r;
    EXPECT_EQ(mesh.ReplicaGroupMembers(r, dp), (std::vector<uint32_t>{r & ~1u, r | 1u})) << r;
  }
  EXPECT_EQ(Members(mesh, 5, {"dp"}), (std::vector<uint32_t>{4, 5}));
}

TEST(MeshLayout, ReplicaGroup_DpTp) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(Members(mesh, 0, {"dp", "tp"}), (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Members(mesh, 6, {"tp", "dp"}), (std::vector<uint32_t>{4, 5, 6, 7}));
  uint64_t mask = *mesh.DimMask({"dp", "tp"});
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(mesh.ReplicaGroupKey(r, mask), 0u);
  for (uint32_t r = 4; r < 8; ++r) EXPECT_EQ(mesh.ReplicaGroupKey(r, mask), 4u);
}

TEST(MeshLayout, ReplicaGroup_PpOnly_SkipsInnerDims) {
  MeshLayout mesh = PpTpDp();
  EXPECT_EQ(Members(mesh, 3, {"pp"}), (std::vector<uint32_t>{3, 7}));
  EXPECT_EQ(Members(mesh, 6, {"pp", "dp"}), (std::vector<uint32_t>{2, 3, 6, 7}));
}

TEST(MeshLayout, ReplicaGroup_NoDims_IsSingleton) {
  MeshLayout mesh = PpTpDp();
  for (uint32_t r = 0; r < 8; ++r) {
    EXPECT_EQ(mesh.ReplicaGroupKey(r, 0), r);
    EXPECT_EQ(Members(mesh, r, {}), (std::vector<uint32_t>{r}));
  }
}

TEST(MeshLayout, ReplicaGroup_AllDims_IsWholeWorld) {
  MeshLayout mesh = PpTpDp();
  for (uint32_t r = 0; r < 8; ++r) {
    EXPECT_EQ(mesh.ReplicaGroupKey(r, 7), 0u);
    EXPECT_EQ(Members(mesh, r, {"pp", "tp", "dp"}),
              (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  }
}

TEST(MeshLayout, ReplicaGroup_KeySharedExactlyByMembers) {
  absl::StatusOr<MeshLayout> mesh =
      MeshLayout::FromProto(MakeLayout({{"pp", 3}, {"dp", 2}, {"tp", 4}}));
  ASSERT_TRUE(mesh.ok());
  for (uint64_t mask = 0; mask < 8; ++mask) {
    for (uint32_t r = 0; r < mesh->world_size(); ++r) {
      std::vector<uint32_t> members = mesh->ReplicaGroupMembers(r, mask);
      size_t expected_size = 1;
      for (size_t i = 0; i < 3; ++i) {
        if ((mask >> i) & 1) expected_size *= mesh->degree(i);
      }
      EXPECT_EQ(members.size(), expected_size);
      std::vector<uint32_t> rc = mesh->Coords(r);
      for (uint32_t m = 0; m < mesh->world_size(); ++m) {
        std::vector<uint32_t> mc = mesh->Coords(m);
        bool same_outside = true;
        for (size_t i = 0; i < 3; ++i) {
          if (!((mask >> i) & 1) && mc[i] != rc[i]) same_outside = false;
        }
        EXPECT_EQ(mesh->ReplicaGroupKey(m, mask) == mesh->ReplicaGroupKey(r, mask), same_outside);
        EXPECT_EQ(std::count(members.begin(), members.end(), m), same_outside ? 1 : 0);
      }
      EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
    }
  }
}

TEST(MeshLayout, Invalid_Rejected) {
  EXPECT_EQ(MeshLayout::FromProto(v1::Layout()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeshLayout::FromProto(MakeLayout({{"dp", 0}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeshLayout::FromProto(MakeLayout({{"pp", 2}, {"tp", 0}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeshLayout::FromProto(MakeLayout({{"dp", 2}, {"tp", 2}, {"dp", 2}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeshLayout::FromProto(MakeLayout({{"", 2}})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MeshLayout, WorldSizeLimit) {
  EXPECT_TRUE(MeshLayout::FromProto(MakeLayout({{"a", 1u << 12}, {"b", 1u << 12}})).ok());
  EXPECT_FALSE(MeshLayout::FromProto(MakeLayout({{"a", 1u << 12}, {"b", (1u << 12) + 1}})).ok());
  // Degrees whose product overflows 32 bits must still be caught.
  EXPECT_FALSE(MeshLayout::FromProto(MakeLayout({{"a", 1u << 31}, {"b", 4}})).ok());
  EXPECT_FALSE(
      MeshLayout::FromProto(MakeLayout({{"a", 0xFFFFFFFFu}, {"b", 0xFFFFFFFFu}, {"c", 2}})).ok());
}

TEST(MeshLayout, TooManyDims_Rejected) {
  std::vector<std::pair<std::string, uint32_t>> dims;
  for (int i = 0; i < 64; ++i) dims.push_back({"d" + std::to_string(i), 1});
  EXPECT_FALSE(MeshLayout::FromProto(MakeLayout(dims)).ok());
  dims.pop_back();
  EXPECT_TRUE(MeshLayout::FromProto(MakeLayout(dims)).ok());
}

TEST(MeshLayout, SameMesh) {
  MeshLayout mesh = PpTpDp();
  EXPECT_TRUE(mesh.SameMesh(MakeLayout({{"pp", 2}, {"tp", 2}, {"dp", 2}})));
  EXPECT_FALSE(mesh.SameMesh(MakeLayout({{"pp", 2}, {"dp", 2}, {"tp", 2}})));
  EXPECT_FALSE(mesh.SameMesh(MakeLayout({{"pp", 2}, {"tp", 2}, {"dp", 4}})));
  EXPECT_FALSE(mesh.SameMesh(MakeLayout({{"pp", 2}, {"tp", 2}})));
  EXPECT_FALSE(mesh.SameMesh(v1::Layout()));
}

}  // namespace
}  // namespace tessera
