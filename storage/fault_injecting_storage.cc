#include "storage/fault_injecting_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
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
#include "common/log.h"
#include "common/status.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// ---------------------------------------------------------------------------------------------
// FaultInjectingStorage

class FaultInjectingWritableFile : public WritableFile {
 public:
  FaultInjectingWritableFile(FaultInjectingStorage* owner, std::unique_ptr<WritableFile> base)
      : owner_(owner), base_(std::move(base)) {}

  absl::Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    if (int err = owner_->WaitUntilWritesReleased(); err != 0) {
      return ErrnoToStatus(err, "pwrite", base_->path(),
                           "(held by fault injection past its limit)");
    }
    const FaultInjectingStorage::WritePermit permit = owner_->AdmitWrite(size);
    if (permit.allowed > 0) RETURN_IF_ERROR(base_->WriteAt(offset, data, permit.allowed));
    if (permit.err != 0) {
      return ErrnoToStatus(permit.err, "pwrite", base_->path(),
                           absl::StrCat("at offset ", offset + permit.allowed, " (",
                                        size - permit.allowed, " bytes)"));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (owner_->read_only()) return ErrnoToStatus(EROFS, "fsync", base_->path());
    if (int err = owner_->sync_errno(); err != 0) return ErrnoToStatus(err, "fsync", base_->path());
    return base_->Sync();
  }

  absl::Status Close() override { return base_->Close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectingStorage* const owner_;
  const std::unique_ptr<WritableFile> base_;
};

FaultInjectingStorage::FaultInjectingStorage(Storage* base) : base_(base) {}

void FaultInjectingStorage::FailWritesAfterBytes(uint64_t bytes, int err) {
  absl::MutexLock lock(&mu_);
  limit_bytes_ = bytes_written_ + bytes;
  limit_errno_ = err;
}

void FaultInjectingStorage::FailNthWrite(uint64_t n, int err) {
  absl::MutexLock lock(&mu_);
  nth_write_ = n == 0 ? 0 : writes_ + n;
  nth_errno_ = err;
}

void FaultInjectingStorage::FailSync(int err) {
  absl::MutexLock lock(&mu_);
  sync_errno_ = err;
}

void FaultInjectingStorage::FailSyncDir(int err) {
  absl::MutexLock lock(&mu_);
  sync_dir_errno_ = err;
}

void FaultInjectingStorage::FailRename(int err) {
  absl::MutexLock lock(&mu_);
  rename_errno_ = err;
}

void FaultInjectingStorage::SetReadOnly(bool read_only) {
  absl::MutexLock lock(&mu_);
  read_only_ = read_only;
}

void FaultInjectingStorage::FailSyncDirAfterDirRename(uint64_t n, int err) {
  absl::MutexLock lock(&mu_);
  sync_dir_after_rename_armed_ = n > 0;
  sync_dir_after_rename_n_ = n;
  sync_dir_after_rename_errno_ = err;
}

void FaultInjectingStorage::SetAfterDirRename(
    std::function<void(const std::string& from, const std::string& to)> hook) {
  absl::MutexLock lock(&mu_);
  after_dir_rename_ = std::move(hook);
}

void FaultInjectingStorage::HoldWritesUntil(std::string release_path, absl::Duration max_hold) {
  absl::MutexLock lock(&mu_);
  writes_released_ = release_path.empty();
  hold_release_path_ = std::move(release_path);
  max_hold_ = max_hold;
  hold_logged_ = false;
}

void FaultInjectingStorage::ReleaseHeldWrites() {
  absl::MutexLock lock(&mu_);
  writes_released_ = true;
}

bool FaultInjectingStorage::AwaitHeldWrites(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return writes_held_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int FaultInjectingStorage::WaitUntilWritesReleased() {
  std::string path;
  absl::Time give_up;
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    if (writes_released_) return 0;
    path = hold_release_path_;
    give_up = absl::Now() + max_hold_;
    ++writes_held_;
    first = !hold_logged_;
    hold_logged_ = true;
  }
  if (first) LogWarning("fault injection: holding writes until ", path, " exists");
  bool released_here = false;
  int err = 0;
  for (;;) {
    const bool exists = base_->FileSize(path).ok();
    absl::MutexLock lock(&mu_);
    if (exists && !writes_released_) {
      writes_released_ = true;
      released_here = true;
    }
    if (writes_released_ || absl::Now() >= give_up) {
      --writes_held_;
      if (!writes_released_) err = EIO;
      break;
    }
    mu_.AwaitWithTimeout(absl::Condition(&writes_released_), absl::Milliseconds(10));
  }
  if (released_here) LogWarning("fault injection: ", path, " exists; writes go on");
  return err;
}

void FaultInjectingStorage::Reset() {
  absl::MutexLock lock(&mu_);
  read_only_ = false;
  limit_errno_ = 0;
  nth_write_ = 0;
  nth_errno_ = 0;
  sync_errno_ = 0;
  sync_dir_errno_ = 0;
  rename_errno_ = 0;
  sync_dir_after_rename_armed_ = false;
  sync_dir_failures_left_ = 0;
  after_dir_rename_ = nullptr;
  writes_released_ = true;
}

absl::Status FaultInjectingStorage::Configure(absl::string_view spec) {
  static constexpr std::pair<absl::string_view, int> kErrnos[] = {
      {"enospc", ENOSPC}, {"eio", EIO}, {"edquot", EDQUOT}, {"erofs", EROFS}, {"eacces", EACCES}};
  std::vector<std::function<void()>> arm;
  for (absl::string_view item : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage fault \"", item, "\": ", why,
                       " (expected ERR:after_bytes=N, ERR:write=N, ERR:sync, ERR:syncdir, "
                       "ERR:rename, ERR:syncdir_after_dir_rename=N, readonly, "
                       "crash_after_dir_rename or hold_writes=PATH; ERR one of enospc, eio, "
                       "edquot, erofs, eacces)"));
    };
    if (absl::EqualsIgnoreCase(item, "readonly")) {
      arm.push_back([this] { SetReadOnly(true); });
      continue;
    }
    if (absl::EqualsIgnoreCase(item, "crash_after_dir_rename")) {
      arm.push_back([this] {
        SetAfterDirRename([](const std::string& from, const std::string& to) {
          LogError("fault injection: crashing after renaming ", from, " to ", to);
          raise(SIGKILL);
        });
      });
      continue;
    }
    if (absl::StartsWith(item, "hold_writes=")) {
      std::string path(item.substr(12));
      if (path.empty()) return bad("hold_writes needs a path");
      arm.push_back([this, path] { HoldWritesUntil(path); });
      continue;
    }
    const size_t colon = item.find(':');
    if (colon == absl::string_view::npos) return bad("no ':'");
    const absl::string_view name = item.substr(0, colon);
    const absl::string_view what = item.substr(colon + 1);
    int err = 0;
    for (const auto& [n, e] : kErrnos) {
      if (absl::EqualsIgnoreCase(name, n)) err = e;
    }
    if (err == 0) return bad(absl::StrCat("unknown error \"", name, "\""));
    uint64_t n = 0;
    if (absl::StartsWith(what, "after_bytes=")) {
      if (!absl::SimpleAtoi(what.substr(12), &n)) return bad("after_bytes needs a number");
      arm.push_back([this, n, err] { FailWritesAfterBytes(n, err); });
    } else if (absl::StartsWith(what, "write=")) {
      if (!absl::SimpleAtoi(what.substr(6), &n) || n == 0) return bad("write needs a number >= 1");
      arm.push_back([this, n, err] { FailNthWrite(n, err); });
    } else if (what == "sync") {
      arm.push_back([this, err] { FailSync(err); });
    } else if (what == "syncdir") {
      arm.push_back([this, err] { FailSyncDir(err); });
    } else if (what == "rename") {
      arm.push_back([this, err] { FailRename(err); });
    } else if (absl::StartsWith(what, "syncdir_after_dir_rename=")) {
      if (!absl::SimpleAtoi(what.substr(25), &n) || n == 0) {
        return bad("syncdir_after_dir_rename needs a number >= 1");
      }
      arm.push_back([this, n, err] { FailSyncDirAfterDirRename(n, err); });
    } else {
      return bad(absl::StrCat("unknown fault \"", what, "\""));
    }
  }
  for (auto& a : arm) a();
  return absl::OkStatus();
}

uint64_t FaultInjectingStorage::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return bytes_written_;
}

uint64_t FaultInjectingStorage::writes() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

FaultInjectingStorage::WritePermit FaultInjectingStorage::AdmitWrite(size_t size) {
  absl::MutexLock lock(&mu_);
  if (read_only_) return {0, EROFS};
  ++writes_;
  if (nth_write_ != 0 && writes_ == nth_write_) return {0, nth_errno_};
  WritePermit permit{size, 0};
  if (limit_errno_ != 0) {
    const uint64_t room = limit_bytes_ > bytes_written_ ? limit_bytes_ - bytes_written_ : 0;
    if (size > room) permit = {static_cast<size_t>(room), limit_errno_};
  }
  bytes_written_ += permit.allowed;
  return permit;
}

int FaultInjectingStorage::sync_errno() const {
  absl::MutexLock lock(&mu_);
  return sync_errno_;
}

bool FaultInjectingStorage::read_only() const {
  absl::MutexLock lock(&mu_);
  return read_only_;
}

Publication FaultInjectingStorage::publication(const std::string& path) const {
  return base_->publication(path);
}

absl::Status FaultInjectingStorage::PutFile(const std::string& path, absl::string_view data,
                                            PutMode mode) {
  if (base_->publication(path) == Publication::kRenameDirectory) {
    return Storage::PutFile(path, data, mode);
  }
  if (read_only()) return ErrnoToStatus(EROFS, "put", path);
  return base_->PutFile(path, data, mode);
}

absl::Status FaultInjectingStorage::CreateDirs(const std::string& path) {
  if (read_only()) return ErrnoToStatus(EROFS, "mkdir", path);
  return base_->CreateDirs(path);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingStorage::OpenForWrite(
    const std::string& path) {
  if (read_only()) return ErrnoToStatus(EROFS, "open", path, "for writing");
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> base, base_->OpenForWrite(path));
  return std::unique_ptr<WritableFile>(
      std::make_unique<FaultInjectingWritableFile>(this, std::move(base)));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> FaultInjectingStorage::OpenForRead(
    const std::string& path) {
  return base_->OpenForRead(path);
}

absl::Status FaultInjectingStorage::SyncDir(const std::string& path) {
  int err;
  {
    absl::MutexLock lock(&mu_);
    err = read_only_ ? EROFS : sync_dir_errno_;
    if (err == 0 && sync_dir_failures_left_ > 0) {
      --sync_dir_failures_left_;
      err = sync_dir_after_rename_errno_;
    }
  }
  if (err != 0) return ErrnoToStatus(err, "fsync", path, "(directory)");
  return base_->SyncDir(path);
}

absl::Status FaultInjectingStorage::Rename(const std::string& from, const std::string& to) {
  int err;
  {
    absl::MutexLock lock(&mu_);
    err = read_only_ ? EROFS : rename_errno_;
  }
  if (err != 0) return ErrnoToStatus(err, "rename", from, absl::StrCat("to ", to));
  RETURN_IF_ERROR(base_->Rename(from, to));
  {
    absl::MutexLock lock(&mu_);
    if (!sync_dir_after_rename_armed_ && after_dir_rename_ == nullptr) return absl::OkStatus();
  }
  if (!base_->ListDir(to).ok()) return absl::OkStatus();  // a file, not a directory
  std::function<void(const std::string&, const std::string&)> hook;
  {
    absl::MutexLock lock(&mu_);
    if (sync_dir_after_rename_armed_) {
      sync_dir_after_rename_armed_ = false;
      sync_dir_failures_left_ = sync_dir_after_rename_n_;
    }
    hook = std::move(after_dir_rename_);
    after_dir_rename_ = nullptr;
  }
  if (hook) hook(from, to);
  return absl::OkStatus();
}

absl::Status FaultInjectingStorage::RemoveTree(const std::string& path) {
  if (read_only()) return ErrnoToStatus(EROFS, "unlink", path);
  return base_->RemoveTree(path);
}

absl::StatusOr<uint64_t> FaultInjectingStorage::FileSize(const std::string& path) {
  return base_->FileSize(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingStorage::ListDir(const std::string& path) {
  return base_->ListDir(path);
}

}  // namespace tessera
