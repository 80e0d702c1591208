#include "tests/sim/sim_storage.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tessera::sim {

class SimWritableFile : public WritableFile {
 public:
  SimWritableFile(SimStorage* storage, std::string path, std::shared_ptr<std::string> contents)
      : storage_(storage), path_(std::move(path)), contents_(std::move(contents)) {}

  absl::Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    if (closed_) return storage_->Error(EBADF, "pwrite", path_);
    const StorageFault fault = storage_->Check(StorageOp::kWrite, path_);
    if (fault.err != 0 && !fault.after) return storage_->Error(fault.err, "pwrite", path_);
    if (contents_->size() < offset + size) contents_->resize(offset + size);
    std::memcpy(contents_->data() + offset, data, size);
    return fault.err != 0 ? storage_->Error(fault.err, "pwrite", path_) : absl::OkStatus();
  }
  absl::Status Sync() override {
    if (closed_) return storage_->Error(EBADF, "fsync", path_);
    const StorageFault fault = storage_->Check(StorageOp::kSync, path_);
    return fault.err != 0 ? storage_->Error(fault.err, "fsync", path_) : absl::OkStatus();
  }
  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    closed_ = true;
    const StorageFault fault = storage_->Check(StorageOp::kClose, path_);
    return fault.err != 0 ? storage_->Error(fault.err, "close", path_) : absl::OkStatus();
  }
  const std::string& path() const override { return path_; }

 private:
  SimStorage* const storage_;
  const std::string path_;
  std::shared_ptr<std::string> contents_;
  bool closed_ = false;
};

class SimReadableFile : public ReadableFile {
 public:
  SimReadableFile(SimStorage* storage, std::string path, std::shared_ptr<std::string> contents)
      : storage_(storage), path_(std::move(path)), contents_(std::move(contents)) {}

  absl::Status ReadAt(uint64_t offset, void* out, size_t size) override {
    const StorageFault fault = storage_->Check(StorageOp::kRead, path_);
    if (fault.err != 0) return storage_->Error(fault.err, "pread", path_);
    if (offset + size > contents_->size()) {
      return IoError(absl::StatusCode::kOutOfRange, path_,
                     absl::StrCat("pread ", path_, " at offset ", offset, " (", size,
                                  " bytes): the file ends at ", contents_->size()));
    }
    std::memcpy(out, contents_->data() + offset, size);
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Size() override { return contents_->size(); }
  const std::string& path() const override { return path_; }

 private:
  SimStorage* const storage_;
  const std::string path_;
  std::shared_ptr<std::string> contents_;
};

std::string SimStorage::Norm(const std::string& path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string SimStorage::Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

StorageFault SimStorage::Check(StorageOp op, const std::string& path) {
  ++operations_;
  return hook_ ? hook_(op, path) : StorageFault{};
}

absl::Status SimStorage::Error(int err, const char* op, const std::string& path) const {
  return ErrnoToStatus(err, op, path);
}

const std::string* SimStorage::Contents(const std::string& path) const {
  auto it = files_.find(Norm(path));
  return it == files_.end() ? nullptr : it->second.get();
}

std::vector<std::string> SimStorage::Children(const std::string& dir) const {
  const std::string d = Norm(dir);
  const std::string prefix = d == "/" ? "/" : d + "/";
  std::vector<std::string> names;
  auto add = [&](const std::string& p) {
    if (p.size() > prefix.size() && absl::StartsWith(p, prefix) &&
        p.find('/', prefix.size()) == std::string::npos) {
      names.push_back(p.substr(prefix.size()));
    }
  };
  for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && absl::StartsWith(*it, prefix);
       ++it) {
    add(*it);
  }
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
    add(it->first);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status SimStorage::CreateDirs(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kCreateDirs, path);
  if (fault.err != 0 && !fault.after) return Error(fault.err, "mkdir", path);
  if (files_.count(path)) return Error(EEXIST, "mkdir", path);
  std::vector<std::string> missing;
  for (std::string p = path; p != "/" && p != "." && !dirs_.count(p); p = Parent(p)) {
    if (files_.count(p)) return Error(ENOTDIR, "mkdir", p);
    missing.push_back(p);
  }
  for (const std::string& p : missing) dirs_.insert(p);
  return fault.err != 0 ? Error(fault.err, "mkdir", path) : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> SimStorage::OpenForWrite(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kOpenForWrite, path);
  if (fault.err != 0) return Error(fault.err, "open", path);
  if (!dirs_.count(Parent(path))) return Error(ENOENT, "open", path);
  if (dirs_.count(path)) return Error(EISDIR, "open", path);
  auto contents = std::make_shared<std::string>();
  files_[path] = contents;
  return std::unique_ptr<WritableFile>(new SimWritableFile(this, path, std::move(contents)));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> SimStorage::OpenForRead(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kOpenForRead, path);
  if (fault.err != 0) return Error(fault.err, "open", path);
  auto it = files_.find(path);
  if (it == files_.end()) return Error(dirs_.count(path) ? EISDIR : ENOENT, "open", path);
  return std::unique_ptr<ReadableFile>(new SimReadableFile(this, path, it->second));
}

absl::Status SimStorage::SyncDir(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kSyncDir, path);
  if (fault.err != 0 && !fault.after) return Error(fault.err, "fsync", path);
  if (!dirs_.count(path)) return Error(ENOENT, "open", path);
  return fault.err != 0 ? Error(fault.err, "fsync", path) : absl::OkStatus();
}

absl::Status SimStorage::Rename(const std::string& raw_from, const std::string& raw_to) {
  const std::string from = Norm(raw_from);
  const std::string to = Norm(raw_to);
  const StorageFault fault = Check(StorageOp::kRename, from);
  if (fault.err != 0 && !fault.after) return Error(fault.err, "rename", from);
  const bool from_dir = dirs_.count(from) > 0;
  if (!from_dir && !files_.count(from)) return Error(ENOENT, "rename", from);
  if (!dirs_.count(Parent(to))) return Error(ENOENT, "rename", to);
  if (from == to) return absl::OkStatus();
  if (from_dir) {
    if (files_.count(to)) return Error(ENOTDIR, "rename", to);
    if (dirs_.count(to)) {
      if (!Children(to).empty()) return Error(ENOTEMPTY, "rename", to);
      dirs_.erase(to);
    }
    const std::string prefix = from + "/";
    std::vector<std::string> moved_dirs = {from};
    for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && absl::StartsWith(*it, prefix);
         ++it) {
      moved_dirs.push_back(*it);
    }
    std::vector<std::string> moved_files;
    for (auto it = files_.lower_bound(prefix);
         it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
      moved_files.push_back(it->first);
    }
    for (const std::string& d : moved_dirs) {
      dirs_.erase(d);
      dirs_.insert(to + d.substr(from.size()));
    }
    for (const std::string& f : moved_files) {
      auto node = files_.extract(f);
      node.key() = to + f.substr(from.size());
      files_.insert(std::move(node));
    }
  } else {
    if (dirs_.count(to)) return Error(EISDIR, "rename", to);
    files_[to] = files_[from];
    files_.erase(from);
  }
  return fault.err != 0 ? Error(fault.err, "rename", from) : absl::OkStatus();
}

absl::Status SimStorage::RemoveTree(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kRemoveTree, path);
  if (fault.err != 0 && !fault.after) return Error(fault.err, "unlink", path);
  if (files_.erase(path) == 0 && dirs_.count(path)) {
    const std::string prefix = path + "/";
    for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && absl::StartsWith(*it, prefix);) {
      it = dirs_.erase(it);
    }
    for (auto it = files_.lower_bound(prefix);
         it != files_.end() && absl::StartsWith(it->first, prefix);) {
      it = files_.erase(it);
    }
    dirs_.erase(path);
  }
  return fault.err != 0 ? Error(fault.err, "unlink", path) : absl::OkStatus();
}

absl::StatusOr<uint64_t> SimStorage::FileSize(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kFileSize, path);
  if (fault.err != 0) return Error(fault.err, "stat", path);
  auto it = files_.find(path);
  if (it != files_.end()) return it->second->size();
  if (dirs_.count(path)) return uint64_t{4096};
  return Error(ENOENT, "stat", path);
}

absl::StatusOr<std::vector<std::string>> SimStorage::ListDir(const std::string& raw) {
  const std::string path = Norm(raw);
  const StorageFault fault = Check(StorageOp::kListDir, path);
  if (fault.err != 0) return Error(fault.err, "opendir", path);
  if (files_.count(path)) return Error(ENOTDIR, "opendir", path);
  if (!dirs_.count(path)) return Error(ENOENT, "opendir", path);
  return Children(path);
}

}  // namespace tessera::sim
