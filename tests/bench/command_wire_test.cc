#include "tests/bench/command_wire.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

v1::RankAssignment SomeAssignment() {
  v1::RankAssignment a;
  a.set_file("data-00003.safetensors");
  v1::WriteItem* w = a.add_writes();
  w->set_key("model/w");
  w->set_nbytes(4096);
  v1::HashItem* h = a.add_hashes();
  h->set_local_shard(2);
  h->set_chunk(7);
  return a;
}

v1::Command Pin(bool with_assignment) {
  v1::Command c;
  c.set_session_id("s1-abc");
  c.set_step(5);
  c.set_seq(9);
  v1::PinCommand* pin = c.mutable_pin();
  pin->set_plan_cached(true);
  pin->set_plan_fingerprint(0x1234567890abcdefull);
  pin->set_copy_when_pinned(true);
  if (with_assignment) {
    *pin->mutable_assignment() = SomeAssignment();
  } else {
    pin->set_assignment_omitted(true);
  }
  return c;
}

TEST(CommandWireTest, Pin_AssignmentKeptAsBytes_EverythingElseParsed) {
  const v1::Command sent = Pin(/*with_assignment=*/true);
  v1::Command got;
  std::string assignment;
  ASSERT_TRUE(ParseCommandKeepingAssignment(sent.SerializeAsString(), &got, &assignment).ok());

  v1::Command expected = sent;
  expected.mutable_pin()->clear_assignment();
  EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
  EXPECT_TRUE(got.has_pin());
  EXPECT_FALSE(got.pin().has_assignment());

  v1::RankAssignment parsed;
  ASSERT_TRUE(parsed.ParseFromString(assignment));
  EXPECT_EQ(parsed.SerializeAsString(), SomeAssignment().SerializeAsString());
}

TEST(CommandWireTest, PinWithoutAssignment_EmptyBytes) {
  const v1::Command sent = Pin(/*with_assignment=*/false);
  v1::Command got;
  std::string assignment = "left over";
  ASSERT_TRUE(ParseCommandKeepingAssignment(sent.SerializeAsString(), &got, &assignment).ok());
  EXPECT_EQ(got.SerializeAsString(), sent.SerializeAsString());
  EXPECT_TRUE(assignment.empty());
}

TEST(CommandWireTest, EmptyPin_StillAPin) {
  v1::Command sent;
  sent.set_session_id("s2");
  sent.mutable_pin();  // every field default: serialized as field 10 of length 0
  v1::Command got;
  std::string assignment;
  ASSERT_TRUE(ParseCommandKeepingAssignment(sent.SerializeAsString(), &got, &assignment).ok());
  EXPECT_TRUE(got.has_pin());
  EXPECT_EQ(got.session_id(), "s2");
}

TEST(CommandWireTest, OtherCommands_ParsedWhole) {
  v1::Command sent;
  sent.set_session_id("s3");
  sent.mutable_persist()->set_tmp_dir("/ckpt/job/step-3.tmp-s3");
  v1::Command got;
  std::string assignment;
  ASSERT_TRUE(ParseCommandKeepingAssignment(sent.SerializeAsString(), &got, &assignment).ok());
  EXPECT_EQ(got.SerializeAsString(), sent.SerializeAsString());
  EXPECT_TRUE(got.has_persist());
  EXPECT_TRUE(assignment.empty());
}

TEST(CommandWireTest, PinTwiceOnTheWire_AssignmentsMerged) {
  v1::Command first = Pin(/*with_assignment=*/true);
  v1::Command second;
  second.mutable_pin()->mutable_assignment()->add_writes()->set_key("model/b");
  const std::string wire = first.SerializeAsString() + second.SerializeAsString();
  v1::Command expected;
  ASSERT_TRUE(expected.ParseFromString(wire));  // what protobuf makes of it: a merge

  v1::Command got;
  std::string assignment;
  ASSERT_TRUE(ParseCommandKeepingAssignment(wire, &got, &assignment).ok());
  v1::RankAssignment parsed;
  ASSERT_TRUE(parsed.ParseFromString(assignment));
  EXPECT_EQ(parsed.SerializeAsString(), expected.pin().assignment().SerializeAsString());
  EXPECT_EQ(parsed.writes_size(), 2);
  expected.mutable_pin()->clear_assignment();
  EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
}

TEST(CommandWireTest, PinBesideAnotherCommand_DataLoss) {
  v1::Command persist;
  persist.mutable_persist()->set_tmp_dir("/ckpt/t");
  const std::string wire =
      Pin(/*with_assignment=*/false).SerializeAsString() + persist.SerializeAsString();
  v1::Command got;
  std::string assignment;
  EXPECT_EQ(ParseCommandKeepingAssignment(wire, &got, &assignment).code(),
            absl::StatusCode::kDataLoss);
}

TEST(CommandWireTest, Truncated_DataLoss) {
  const std::string wire = Pin(/*with_assignment=*/true).SerializeAsString();
  v1::Command got;
  std::string assignment;
  const absl::Status status =
      ParseCommandKeepingAssignment(wire.substr(0, wire.size() - 3), &got, &assignment);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
}

}  // namespace
}  // namespace tessera
