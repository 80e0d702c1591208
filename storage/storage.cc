#include "storage/storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "common/ids.h"
#include "common/status.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace {

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer to the message (in buf or a static string).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return text != nullptr ? std::string(text) : absl::StrCat("unknown error ", err);
}



}  // namespace

absl::Status IoError(absl::StatusCode code, absl::string_view path, std::string message) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_IO_ERROR);
  detail.set_message(std::move(message));
  detail.set_path(std::string(path));
  return MakeError(code, detail);
}

absl::StatusCode ErrnoToCode(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::StatusCode::kResourceExhausted;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case EROFS:
      return absl::StatusCode::kFailedPrecondition;
    case EIO:
      return absl::StatusCode::kDataLoss;
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY:
      return absl::StatusCode::kAlreadyExists;
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case EINVAL:
      return absl::StatusCode::kInvalidArgument;
    case ETIMEDOUT:
    case ESTALE:
    case EAGAIN:
    case EBUSY:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path,
                           absl::string_view what) {
  std::string message = absl::StrCat(op, " ", path);
  if (!what.empty()) absl::StrAppend(&message, " ", what);
  absl::StrAppend(&message, ": ", ErrnoText(err), " (errno ", err, ")");
  return IoError(ErrnoToCode(err), path, std::move(message));
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> ReadFileToString(Storage& storage, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, storage.OpenForRead(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::string out(size, '\0');
  RETURN_IF_ERROR(file->ReadAt(0, out.data(), out.size()));
  return out;
}

absl::Status Storage::PutFile(const std::string& path, absl::string_view data, PutMode mode) {
  if (mode == PutMode::kCreateOnly) {
    return IoError(absl::StatusCode::kUnimplemented, path,
                   absl::StrCat("cannot create ", path, " only if absent: this storage publishes "
                                "checkpoints by renaming directories"));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string tmp_path =
      JoinPath(dir, absl::StrFormat(".%s.tmp-%016x", name, NewIncarnation()));
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = OpenForWrite(tmp_path);
    if (!file.ok()) return file.status();
    absl::Status s = (*file)->WriteAt(0, data.data(), data.size());
    if (s.ok()) s = (*file)->Sync();
    absl::Status closed = (*file)->Close();
    if (s.ok()) s = closed;
    if (!s.ok()) return s;
    return Rename(tmp_path, path);
  }();
  if (!status.ok()) (void)RemoveTree(tmp_path);
  return status;
}

}  // namespace tessera
