#include "storage/direct_io_probe.h"

#include <fcntl.h>
#include <unistd.h>

namespace tessera {

bool SupportsDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.odirect_probe";
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  return fd >= 0;
}

}  // namespace tessera
