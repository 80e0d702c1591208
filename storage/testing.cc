#include "storage/testing.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

namespace tessera {

std::string MakeTempDir(const std::string& prefix, const std::string& base) {
  std::string root = base;
  for (const char* var : {"TESSERA_TEST_TMPDIR", "TEST_TMPDIR"}) {
    if (!root.empty()) break;
    const char* v = getenv(var);
    if (v != nullptr && *v != '\0') root = v;
  }
  if (root.empty()) root = "/tmp";
  std::string templ = root + "/" + prefix + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return "";
  return templ;
}

bool SupportsDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.odirect_probe";
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  return fd >= 0;
}

}  // namespace tessera
