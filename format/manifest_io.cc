#include "format/manifest_io.h"

#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/ids.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "google/protobuf/util/json_util.h"

namespace tessera {
namespace {

absl::Status Invalid(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", key, "\": ", what));
}

absl::Status ValidateChunk(const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk,
                           size_t elem_size) {
  const Box box = BoxFromProto(chunk.box());
  const std::string where = absl::StrCat("chunk ", BoxToString(box));
  if (absl::Status s = ValidateBoxInShape(box, tensor.global_shape()); !s.ok()) {
    return Invalid(tensor.key(), absl::StrCat(where, " is not inside the tensor: ", s.message()));
  }
  if (!IsPlainFileName(chunk.file())) {
    return Invalid(tensor.key(),
                   absl::StrCat(where, " names file \"", chunk.file(),
                                "\", which is not a plain file name in the checkpoint"));
  }
  // The box is inside a shape whose volume fits int64, so its volume does too.
  const uint64_t volume = static_cast<uint64_t>(*Volume(box));
  unsigned __int128 expected = static_cast<unsigned __int128>(volume) * elem_size;
  if (expected != chunk.nbytes()) {
    return Invalid(tensor.key(), absl::StrCat(where, " has nbytes ", chunk.nbytes(),
                                              " but its box holds ",
                                              static_cast<uint64_t>(expected), " bytes"));
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(chunk.offset(), chunk.nbytes(), &end)) {
    return Invalid(tensor.key(), absl::StrCat(where, " has offset + nbytes past 2^64"));
  }
  if (chunk.nbytes() > 0 && chunk.block_size() == 0) {
    return Invalid(tensor.key(), absl::StrCat(where, " has block_size 0"));
  }
  const uint64_t blocks =
      chunk.nbytes() == 0 ? 0 : (chunk.nbytes() + chunk.block_size() - 1) / chunk.block_size();
  if (static_cast<uint64_t>(chunk.block_xxh3_size()) != blocks) {
    return Invalid(tensor.key(), absl::StrCat(where, " has ", chunk.block_xxh3_size(),
                                              " block checksums; ", chunk.nbytes(),
                                              " bytes in blocks of ", chunk.block_size(),
                                              " need ", blocks));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const v1::TensorEntry& tensor) {
  const std::string& key = tensor.key();
  if (tensor.kind() == v1::SHARD_KIND_UNSPECIFIED || !v1::ShardKind_IsValid(tensor.kind())) {
    return Invalid(key, "kind is unspecified or unknown");
  }
  if (absl::Status s = ValidateName(tensor.fqn()); !s.ok()) {
    return Invalid(key, absl::StrCat("bad fqn: ", s.message()));
  }
  // Optimizer state no rank has yet is one entry "<fqn>#" with an empty state key.
  if (tensor.kind() == v1::SHARD_KIND_OPTIMIZER &&
      !(tensor.state_absent() && tensor.state_key().empty())) {
    if (absl::Status s = ValidateName(tensor.state_key()); !s.ok()) {
      return Invalid(key, absl::StrCat("bad state_key: ", s.message()));
    }
  }
  const std::string expected_key =
      TensorKey(tensor.kind(), tensor.fqn(), tensor.state_key(), tensor.rank());
  if (key != expected_key) {
    return Invalid(key, absl::StrCat("key should be \"", expected_key, "\" for its kind, fqn, ",
                                     "state_key and rank"));
  }
  if (!IsKnownDType(tensor.dtype())) return Invalid(key, "dtype is unspecified or unknown");
  if (absl::StatusOr<int64_t> v = CheckedVolume(tensor.global_shape()); !v.ok()) {
    return Invalid(key, absl::StrCat("bad global_shape: ", v.status().message()));
  }
  // Byte size of the whole tensor must fit too: every offset is computed from it.
  const int64_t elements = *CheckedVolume(tensor.global_shape());
  int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<int64_t>(DTypeSize(tensor.dtype())), &bytes)) {
    return Invalid(key, "global_shape's byte size overflows int64");
  }
  if (tensor.state_absent()) {
    if (tensor.kind() != v1::SHARD_KIND_OPTIMIZER) {
      return Invalid(key, "state_absent is set on an entry that is not optimizer state");
    }
    if (tensor.chunks_size() != 0) return Invalid(key, "state_absent but has chunks");
  }
  for (const v1::ChunkEntry& chunk : tensor.chunks()) {
    RETURN_IF_ERROR(ValidateChunk(tensor, chunk, DTypeSize(tensor.dtype())));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos && name != kManifestFileName &&
         name != kManifestJsonFileName;
}

absl::Status ValidateManifest(const v1::Manifest& manifest) {
  if (manifest.format_version() != kManifestFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("format_version is ",
                                                   manifest.format_version(), "; this build reads ",
                                                   kManifestFormatVersion));
  }
  if (!IsValidJobId(manifest.job_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id \"", manifest.job_id(), "\" is not a valid job id"));
  }
  if (manifest.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", manifest.step(), " is negative"));
  }
  if (manifest.session_id().empty()) return absl::InvalidArgumentError("session_id is empty");
  absl::flat_hash_set<absl::string_view> keys;
  keys.reserve(manifest.tensors_size());
  unsigned __int128 total = 0;
  for (const v1::TensorEntry& tensor : manifest.tensors()) {
    if (!keys.insert(tensor.key()).second) {
      return Invalid(tensor.key(), "appears more than once");
    }
    RETURN_IF_ERROR(ValidateTensor(tensor));
    for (const v1::ChunkEntry& chunk : tensor.chunks()) total += chunk.nbytes();
  }
  if (total != manifest.total_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_bytes is ", manifest.total_bytes(), " but the chunks hold ",
                     static_cast<uint64_t>(total), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ManifestToJson(const v1::Manifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  google::protobuf::util::Status s =
      google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot convert the manifest to JSON: ", s.message().ToString()));
  }
  return json;
}

absl::Status WriteManifest(Storage& storage, const std::string& dir,
                           const v1::Manifest& manifest) {
  ASSIGN_OR_RETURN(std::string json, ManifestToJson(manifest));
  std::string binary;
  if (!manifest.SerializeToString(&binary)) {
    return absl::InternalError("cannot serialize the manifest");
  }
  RETURN_IF_ERROR(
      storage.PutFile(JoinPath(dir, kManifestJsonFileName), json, PutMode::kReplace));
  RETURN_IF_ERROR(storage.PutFile(JoinPath(dir, kManifestFileName), binary, PutMode::kReplace));
  return storage.SyncDir(dir);
}

std::string DataDirOf(const Storage& storage, const std::string& dir,
                      const v1::Manifest& manifest) {
  if (storage.publication(dir) == Publication::kRenameDirectory) return dir;
  std::string parent = dir;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  const size_t slash = parent.rfind('/');
  parent = slash == std::string::npos ? std::string(".") : parent.substr(0, slash);
  return JoinPath(parent, TmpDirName(manifest.step(), manifest.session_id()));
}

absl::StatusOr<v1::Manifest> ReadManifest(Storage& storage, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestFileName);
  absl::StatusOr<std::string> bytes = ReadFileToString(storage, path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) {
      v1::ErrorDetail detail;
      detail.set_code(v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
      detail.set_path(path);
      detail.set_message(absl::StrCat("no committed checkpoint at ", dir, ": ", path,
                                      " does not exist"));
      return MakeError(absl::StatusCode::kNotFound, detail);
    }
    return bytes.status();
  }
  v1::ErrorDetail detail;
  detail.set_path(path);
  v1::Manifest manifest;
  if (!manifest.ParseFromString(*bytes)) {
    detail.set_message(absl::StrCat("manifest ", path, " is not a valid Manifest protobuf"));
    return MakeError(absl::StatusCode::kDataLoss, detail);
  }
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    detail.set_message(absl::StrCat("manifest ", path, " is malformed: ", s.message()));
    return MakeError(absl::StatusCode::kDataLoss, detail);
  }
  return manifest;
}

}  // namespace tessera
