// SupportsDirectIo: whether a directory's file system accepts O_DIRECT opens, for tests whose
// expectations differ between the two paths PosixStorage takes (storage/posix_storage.h).
#ifndef TESSERA_STORAGE_DIRECT_IO_PROBE_H_
#define TESSERA_STORAGE_DIRECT_IO_PROBE_H_

#include <string>

namespace tessera {

// True if the file system holding `dir` accepts O_DIRECT opens (a probe file is created in
// `dir` and removed). A file system may still refuse the transfers themselves; PosixStorage
// then falls back to the page cache, which its counters show.
bool SupportsDirectIo(const std::string& dir);

}  // namespace tessera

#endif  // TESSERA_STORAGE_DIRECT_IO_PROBE_H_
