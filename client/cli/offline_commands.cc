#include "client/cli/offline_commands.h"

#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/exit_codes.h"
#include "client/cli/format_util.h"
#include "client/cli/json_writer.h"
#include "client/cli/table.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {
namespace cli {
namespace {

// Keys shown in the human export report per reason; the JSON lists them all.
constexpr size_t kListedKeys = 5;

std::string Plural(uint64_t n, absl::string_view singular, absl::string_view plural) {
  return absl::StrCat(n, " ", n == 1 ? singular : plural);
}

// The first kListedKeys of `keys`, then "and N more".
std::string ListKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> shown(keys.begin(), keys.begin() + std::min(keys.size(), kListedKeys));
  std::string text = absl::StrJoin(shown, ", ");
  if (keys.size() > kListedKeys)
    absl::StrAppend(&text, ", and ", keys.size() - kListedKeys, " more");
  return text;
}

void WriteStringArray(JsonWriter& w, const std::vector<std::string>& values) {
  w.BeginArray();
  for (const std::string& v : values) w.String(v);
  w.EndArray();
}

uint64_t TensorBytes(const v1::TensorEntry& t) {
  uint64_t bytes = 0;
  for (const v1::ChunkEntry& c : t.chunks()) bytes += c.nbytes();
  return bytes;
}

struct FileSummary {
  uint64_t chunks = 0;
  uint64_t bytes = 0;
};

}  // namespace

int VerifyCommand(Storage& storage, const std::string& dir, const VerifyCommandOptions& options,
                  std::ostream& out, std::ostream& err) {
  // A mistyped path is a usage error, not a broken checkpoint.
  absl::StatusOr<std::vector<std::string>> listing = storage.ListDir(dir);
  if (!listing.ok()) {
    err << "error: cannot read checkpoint directory " << dir << ": " << listing.status().message()
        << '\n';
    return kExitError;
  }
  VerifyReport report = VerifyCheckpoint(storage, dir, options.verify);
  if (options.json) {
    JsonWriter w;
    w.BeginObject();
    w.Key("dir").String(dir);
    w.Key("ok").Bool(report.ok());
    w.Key("tensors").Uint(report.tensors);
    w.Key("extras").Uint(report.extras);
    w.Key("chunks").Uint(report.chunks);
    w.Key("files").Uint(report.files);
    w.Key("bytes_verified").Uint(report.bytes_verified);
    w.Key("checksums").Bool(options.verify.checksums);
    w.Key("problems").BeginArray();
    for (const VerifyProblem& p : report.problems) {
      w.BeginObject();
      w.Key("kind").String(ProblemKindName(p.kind));
      w.Key("code").String(ErrorCodeName(p.code));
      w.Key("tensor").String(p.tensor_key);
      w.Key("chunk").String(p.chunk);
      w.Key("file").String(p.file);
      w.Key("message").String(p.message);
      w.EndObject();
    }
    w.EndArray();
    w.Key("problems_dropped").Uint(report.problems_dropped);
    w.EndObject();
    out << w.Finish();
    return report.ok() ? kExitOk : kExitFailed;
  }
  if (report.ok()) {
    out << "OK: " << Plural(report.tensors, "tensor", "tensors") << ", "
        << Plural(report.chunks, "chunk", "chunks") << ", " << report.bytes_verified
        << " bytes verified (" << FormatBytes(report.bytes_verified) << " in "
        << Plural(report.files, "data file", "data files")
        << (options.verify.checksums ? "" : "; checksums not checked");
    if (report.extras > 0) {
      out << "; of the tensors, " << report.extras
          << (report.extras == 1 ? " is a per-rank extra" : " are per-rank extras")
          << ": objects, RNG state";
    }
    out << ")\n";
    return kExitOk;
  }
  const uint64_t total = report.problems.size() + report.problems_dropped;
  out << "FAILED: " << Plural(total, "problem", "problems") << " in " << dir << '\n';
  size_t listed = 0;
  for (const VerifyProblem& p : report.problems) {
    if (listed == options.max_listed) break;
    out << "  " << ProblemKindName(p.kind) << ": " << p.message << '\n';
    ++listed;
  }
  if (total > listed) out << "  ... and " << (total - listed) << " more (use --json for all)\n";
  return kExitFailed;
}

int InspectCommand(Storage& storage, const std::string& dir, const InspectCommandOptions& options,
                   std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::Manifest> manifest_or = ReadManifest(storage, dir);
  if (!manifest_or.ok()) {
    err << "error: cannot read the manifest of " << dir << ": " << manifest_or.status().message()
        << '\n';
    return kExitError;
  }
  const v1::Manifest& m = *manifest_or;

  // Data files in name order, with the size on disk (nullopt if missing or unreadable).
  std::map<std::string, FileSummary> files;
  uint64_t chunks = 0, params = 0, optimizer = 0, absent = 0, extras = 0;
  for (const v1::TensorEntry& t : m.tensors()) {
    chunks += t.chunks_size();
    params += t.kind() == v1::SHARD_KIND_PARAM;
    optimizer += t.kind() == v1::SHARD_KIND_OPTIMIZER;
    absent += t.state_absent();
    extras += t.kind() == v1::SHARD_KIND_EXTRA;
    for (const v1::ChunkEntry& c : t.chunks()) {
      FileSummary& f = files[c.file()];
      ++f.chunks;
      f.bytes += c.nbytes();
    }
  }
  std::map<std::string, absl::StatusOr<uint64_t>> sizes;
  const std::string data_dir = DataDirOf(storage, dir, m);
  for (const auto& [name, summary] : files) {
    sizes.emplace(name, storage.FileSize(JoinPath(data_dir, name)));
  }
  absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(m.layout());
  const std::string layout = m.layout().dims_size() > 0 ? LayoutSpec(m.layout()) : "";

  if (options.json) {
    JsonWriter w;
    w.BeginObject();
    w.Key("dir").String(dir);
    w.Key("format_version").Uint(m.format_version());
    w.Key("job_id").String(m.job_id());
    w.Key("step").Int(m.step());
    w.Key("session_id").String(m.session_id());
    w.Key("layout").String(layout);
    w.Key("world_size").Uint(mesh.ok() ? mesh->world_size() : 0);
    w.Key("committed_unix_ms").Int(m.committed_unix_ms());
    w.Key("total_bytes").Uint(m.total_bytes());
    w.Key("chunks").Uint(chunks);
    w.Key("tensors").BeginArray();
    for (const v1::TensorEntry& t : m.tensors()) {
      w.BeginObject();
      w.Key("key").String(t.key());
      w.Key("fqn").String(t.fqn());
      w.Key("kind").String(KindName(t.kind()));
      if (t.kind() == v1::SHARD_KIND_OPTIMIZER) w.Key("state_key").String(t.state_key());
      if (t.kind() == v1::SHARD_KIND_EXTRA) w.Key("rank").Uint(t.rank());
      w.Key("dtype").String(DTypeName(t.dtype()));
      w.Key("shape").BeginArray();
      for (int64_t d : t.global_shape()) w.Int(d);
      w.EndArray();
      w.Key("chunks").Uint(t.chunks_size());
      w.Key("bytes").Uint(TensorBytes(t));
      w.Key("state_absent").Bool(t.state_absent());
      if (options.chunks) {
        w.Key("chunk_list").BeginArray();
        for (const v1::ChunkEntry& c : t.chunks()) {
          w.BeginObject();
          w.Key("box").String(BoxToString(BoxFromProto(c.box())));
          w.Key("file").String(c.file());
          w.Key("offset").Uint(c.offset());
          w.Key("nbytes").Uint(c.nbytes());
          w.Key("writer_rank").Uint(c.writer_rank());
          w.EndObject();
        }
        w.EndArray();
      }
      w.EndObject();
    }
    w.EndArray();
    w.Key("files").BeginArray();
    for (const auto& [name, summary] : files) {
      w.BeginObject();
      w.Key("name").String(name);
      w.Key("chunks").Uint(summary.chunks);
      w.Key("bytes").Uint(summary.bytes);
      const absl::StatusOr<uint64_t>& size = sizes.at(name);
      w.Key("size");
      if (size.ok()) {
        w.Uint(*size);
      } else {
        w.Null();
      }
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    out << w.Finish();
    return kExitOk;
  }

  out << "checkpoint " << dir << '\n';
  out << "job " << m.job_id() << "  step " << m.step() << "  session " << m.session_id()
      << "  committed " << FormatUnixMs(m.committed_unix_ms()) << '\n';
  out << "layout " << (layout.empty() ? "-" : layout);
  if (mesh.ok()) out << " (" << Plural(mesh->world_size(), "rank", "ranks") << ")";
  out << '\n';
  out << Plural(m.tensors_size(), "tensor", "tensors") << ": " << params << " params, " << optimizer
      << " optimizer";
  if (absent > 0) out << " (" << absent << " absent)";
  out << ", " << Plural(extras, "extra", "extras") << "; " << Plural(chunks, "chunk", "chunks")
      << " in " << Plural(files.size(), "data file", "data files") << "; "
      << FormatBytes(m.total_bytes()) << '\n';

  if (m.tensors_size() > 0) {
    out << '\n';
    Table tensors({"KEY", "KIND", "DTYPE", "SHAPE", "CHUNKS", "BYTES"});
    tensors.AlignRight(4);
    tensors.AlignRight(5);
    for (const v1::TensorEntry& t : m.tensors()) {
      tensors.AddRow({t.key(), t.state_absent() ? "optimizer (absent)" : KindName(t.kind()),
                      std::string(DTypeName(t.dtype())), FormatShape(t.global_shape()),
                      absl::StrCat(t.chunks_size()), FormatBytes(TensorBytes(t))});
    }
    tensors.Print(out);
  }
  if (options.chunks && chunks > 0) {
    out << '\n';
    Table table({"KEY", "BOX", "FILE", "OFFSET", "BYTES", "WRITER"});
    for (size_t c : {3, 4, 5}) table.AlignRight(c);
    for (const v1::TensorEntry& t : m.tensors()) {
      for (const v1::ChunkEntry& c : t.chunks()) {
        table.AddRow({t.key(), BoxToString(BoxFromProto(c.box())), c.file(),
                      absl::StrCat(c.offset()), FormatBytes(c.nbytes()),
                      absl::StrCat(c.writer_rank())});
      }
    }
    table.Print(out);
  }
  if (!files.empty()) {
    out << '\n';
    Table table({"FILE", "CHUNKS", "CHUNK BYTES", "SIZE"});
    for (size_t c : {1, 2, 3}) table.AlignRight(c);
    for (const auto& [name, summary] : files) {
      const absl::StatusOr<uint64_t>& size = sizes.at(name);
      table.AddRow({name, absl::StrCat(summary.chunks), FormatBytes(summary.bytes),
                    size.ok()                         ? FormatBytes(*size)
                    : absl::IsNotFound(size.status()) ? "missing"
                                                      : "unreadable"});
    }
    table.Print(out);
  }
  return kExitOk;
}

int ExportCommand(Storage& storage, const std::string& dir, const std::string& out_path,
                  const ExportOptions& options, bool json, std::ostream& out, std::ostream& err) {
  absl::StatusOr<ExportReport> report = ExportConsolidated(storage, dir, out_path, options);
  if (!report.ok()) {
    err << "error: export of " << dir << " failed: " << report.status().message() << '\n';
    return kExitError;
  }
  if (json) {
    JsonWriter w;
    w.BeginObject();
    w.Key("out").String(report->out_path);
    w.Key("tensors").Uint(report->tensors);
    w.Key("data_bytes").Uint(report->data_bytes);
    w.Key("file_bytes").Uint(report->file_bytes);
    w.Key("skipped_extras");
    WriteStringArray(w, report->skipped_extras);
    w.Key("skipped_absent_optimizer");
    WriteStringArray(w, report->skipped_absent_optimizer);
    w.Key("skipped_optimizer");
    WriteStringArray(w, report->skipped_optimizer);
    w.EndObject();
    out << w.Finish();
    return kExitOk;
  }
  out << "wrote " << report->out_path << ": " << Plural(report->tensors, "tensor", "tensors")
      << ", " << FormatBytes(report->data_bytes) << '\n';
  if (!report->skipped_extras.empty()) {
    out << "skipped " << Plural(report->skipped_extras.size(), "extra", "extras")
        << " (per-rank opaque bytes, not tensors): " << ListKeys(report->skipped_extras) << '\n';
  }
  if (!report->skipped_absent_optimizer.empty()) {
    out << "skipped "
        << Plural(report->skipped_absent_optimizer.size(), "optimizer state", "optimizer states")
        << " recorded as absent (no rank had state yet when it was saved): "
        << ListKeys(report->skipped_absent_optimizer) << '\n';
  }
  if (!report->skipped_optimizer.empty()) {
    out << "skipped "
        << Plural(report->skipped_optimizer.size(), "optimizer state", "optimizer states")
        << " (use --filter=all to include them): " << ListKeys(report->skipped_optimizer) << '\n';
  }
  return kExitOk;
}

}  // namespace cli
}  // namespace tessera
