#include "client/cli/export.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "format/data_file.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {
namespace cli {
namespace {

// A tensor to write and where its bytes go in the data section.
struct Placed {
  const v1::TensorEntry* tensor;
  int64_t elements;
  uint64_t begin;  // data_offsets, relative to the data section
  uint64_t end;
};

void AppendMetadataField(std::string* json, absl::string_view key, absl::string_view value,
                         bool first) {
  if (!first) json->push_back(',');
  AppendJsonString(json, key);
  json->push_back(':');
  AppendJsonString(json, value);
}

// The file's bytes before the data section: length prefix, JSON, spaces to 8-byte alignment.
std::string BuildHeader(const v1::Manifest& manifest, const std::vector<Placed>& placed) {
  std::string json = "{\"__metadata__\":{";
  AppendMetadataField(&json, "format", "pt", true);
  AppendMetadataField(&json, "tessera_job", manifest.job_id(), false);
  AppendMetadataField(&json, "tessera_step", absl::StrCat(manifest.step()), false);
  AppendMetadataField(&json, "tessera_session", manifest.session_id(), false);
  json.push_back('}');
  for (const Placed& p : placed) {
    json.push_back(',');
    AppendJsonString(&json, p.tensor->key());
    absl::StrAppend(&json, ":{\"dtype\":\"", DTypeName(p.tensor->dtype()), "\",\"shape\":[");
    for (int d = 0; d < p.tensor->global_shape_size(); ++d) {
      if (d > 0) json.push_back(',');
      absl::StrAppend(&json, p.tensor->global_shape(d));
    }
    absl::StrAppend(&json, "],\"data_offsets\":[", p.begin, ",", p.end, "]}");
  }
  json.push_back('}');
  // The safetensors reference writer pads the header with spaces so the data is 8-aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string header(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return header + json;
}

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Reads `p`'s tensor in pieces of at most `buffer_elements` elements into `buffer` and writes
// each at its place in `file`.
absl::Status CopyTensor(const CheckpointReader& reader, const Placed& p, uint64_t data_start,
                        int64_t buffer_elements, char* buffer, WritableFile& file) {
  const v1::TensorEntry& t = *p.tensor;
  const uint64_t element_size = DTypeSize(t.dtype());
  ReadRequest request;
  request.key = t.key();
  request.dtype = t.dtype();
  request.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
  request.box = FullBox(request.global_shape);
  request.dest = buffer;
  for (int64_t begin = 0; begin < p.elements; begin += buffer_elements) {
    const int64_t end = std::min(p.elements, begin + buffer_elements);
    if (begin == 0 && end == p.elements) {
      request.flat_range.reset();
    } else {
      v1::FlatRange range;
      range.set_begin(begin);
      range.set_end(end);
      request.flat_range = range;
    }
    request.dest_size = static_cast<uint64_t>(end - begin) * element_size;
    RETURN_IF_ERROR(reader.Read({request}));
    RETURN_IF_ERROR(file.WriteAt(data_start + p.begin + static_cast<uint64_t>(begin) * element_size,
                                 buffer, request.dest_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportFilter> ParseExportFilter(absl::string_view name) {
  if (name == "params") return ExportFilter::kParams;
  if (name == "all") return ExportFilter::kAll;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown export filter \"", name, "\": use params or all"));
}

absl::StatusOr<ExportReport> ExportConsolidated(Storage& storage, const std::string& checkpoint_dir,
                                                const std::string& out_path,
                                                const ExportOptions& options) {
  if (options.max_buffer_bytes == 0) {
    return absl::InvalidArgumentError("export: max_buffer_bytes must be at least 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                   CheckpointReader::Open(&storage, checkpoint_dir, options.reader));
  const v1::Manifest& manifest = reader->manifest();

  ExportReport report;
  report.out_path = out_path;
  std::vector<Placed> placed;
  for (const v1::TensorEntry& t : manifest.tensors()) {
    if (t.kind() == v1::SHARD_KIND_EXTRA) {
      report.skipped_extras.push_back(t.key());
      continue;
    }
    if (t.kind() == v1::SHARD_KIND_OPTIMIZER) {
      if (t.state_absent()) {
        report.skipped_absent_optimizer.push_back(t.key());
        continue;
      }
      if (options.filter == ExportFilter::kParams) {
        report.skipped_optimizer.push_back(t.key());
        continue;
      }
    }
    // ReadManifest validated the shape: its element count fits int64.
    ASSIGN_OR_RETURN(int64_t elements, CheckedVolume(t.global_shape()));
    placed.push_back(Placed{&t, elements, 0, 0});
  }
  std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return DTypeSize(a.tensor->dtype()) > DTypeSize(b.tensor->dtype());
  });
  uint64_t offset = 0;
  int64_t largest = 0;  // elements of the biggest buffer any tensor needs
  for (Placed& p : placed) {
    const uint64_t element_size = DTypeSize(p.tensor->dtype());
    const int64_t buffer_elements =
        std::max<int64_t>(1, static_cast<int64_t>(options.max_buffer_bytes / element_size));
    largest = std::max(largest,
                       std::min(p.elements, buffer_elements) * static_cast<int64_t>(element_size));
    p.begin = offset;
    offset += static_cast<uint64_t>(p.elements) * element_size;
    p.end = offset;
  }
  const std::string header = BuildHeader(manifest, placed);

  const std::string tmp_path = absl::StrCat(out_path, ".tessera-tmp");
  auto fail = [&](absl::Status status) {
    storage.RemoveTree(tmp_path).IgnoreError();
    return status;
  };
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, storage.OpenForWrite(tmp_path));
  absl::Status status = file->WriteAt(0, header.data(), header.size());
  if (!status.ok()) return fail(status);
  std::unique_ptr<char[]> buffer(new char[std::max<int64_t>(largest, 1)]);
  for (const Placed& p : placed) {
    if (p.elements == 0) continue;
    const uint64_t element_size = DTypeSize(p.tensor->dtype());
    const int64_t buffer_elements =
        std::max<int64_t>(1, static_cast<int64_t>(options.max_buffer_bytes / element_size));
    status = CopyTensor(*reader, p, header.size(), buffer_elements, buffer.get(), *file);
    if (!status.ok()) return fail(status);
  }
  report.tensors = placed.size();
  report.data_bytes = offset;
  report.file_bytes = header.size() + offset;
  status = file->Sync();
  if (status.ok()) status = file->Close();
  if (status.ok()) status = storage.Rename(tmp_path, out_path);
  if (!status.ok()) return fail(status);
  // Make the rename durable; a file system that cannot sync directories still has the file.
  storage.SyncDir(ParentDir(out_path)).IgnoreError();
  return report;
}

}  // namespace cli
}  // namespace tessera
