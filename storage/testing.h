// Helpers for tests that put files on a real file system: a fresh temporary directory, and
// whether O_DIRECT is taken there (expectations differ between the two paths PosixStorage
// takes, storage/posix_storage.h).
#ifndef TESSERA_STORAGE_TESTING_H_
#define TESSERA_STORAGE_TESTING_H_

#include <string>

namespace tessera {

// A fresh directory `<base>/<prefix>.XXXXXX` (mkdtemp). `base` defaults to TESSERA_TEST_TMPDIR,
// else Bazel's TEST_TMPDIR, else /tmp. Returns "" if it could not be made.
std::string MakeTempDir(const std::string& prefix, const std::string& base = "");

// True if the file system holding `dir` accepts O_DIRECT opens (a probe file is created in
// `dir` and removed). A file system may still refuse the transfers themselves; PosixStorage
// then falls back to the page cache, which its counters show.
bool SupportsDirectIo(const std::string& dir);

}  // namespace tessera

#endif  // TESSERA_STORAGE_TESTING_H_
