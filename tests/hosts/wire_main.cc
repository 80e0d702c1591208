// tessera-wire: a lossy, slow link between two TUN devices, for the partition tests
// (tests/hosts/partition_test.sh; tests/hosts/lib.sh's join_through_wire). It creates both
// devices in the network namespace it starts in; the caller moves one elsewhere, gives both
// addresses and routes, and every IP packet written to one device comes out of the other,
// `--delay_ms` later, unless dropped (`--loss_percent`): netem's `delay` and `loss` on a kernel
// without netem. The rules are WireCore's (wire_core.h); this file only moves packets.
//
// Prints "tessera-wire: up ..." on stderr once both devices exist; on SIGTERM or SIGINT,
// "tessera-wire: stopped: N delivered, M dropped" and exits 0. Exits 1 if a device cannot be
// made (no /dev/net/tun, no CAP_NET_ADMIN), 2 on a bad flag.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/program.h"
#include "tests/hosts/wire_core.h"

ABSL_FLAG(std::string, tun_a, "", "name of the TUN device made for one end; required");
ABSL_FLAG(std::string, tun_b, "", "name of the TUN device made for the other end; required");
ABSL_FLAG(int32_t, delay_ms, 0, "each packet's delay, each way");
ABSL_FLAG(double, loss_percent, 0.0, "chance that a packet is dropped, in percent");
ABSL_FLAG(uint64_t, seed, 1, "seed of the drops");

namespace {

std::atomic<bool> stop{false};
void OnSignal(int) { stop = true; }

// A TUN device named `name` (IP packets, no packet-information header), non-blocking; -1
// with the reason on stderr if it cannot be made.
int OpenTun(const std::string& name) {
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "tessera-wire: /dev/net/tun: %s\n", std::strerror(errno));
    return -1;
  }
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name.c_str());
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
    std::fprintf(stderr, "tessera-wire: TUNSETIFF %s: %s\n", name.c_str(), std::strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::InitProgram("A lossy, slow link between two TUN devices (netem's delay and loss).",
                       argc, argv);
  const std::string names[2] = {absl::GetFlag(FLAGS_tun_a), absl::GetFlag(FLAGS_tun_b)};
  tessera::WireOptions options;
  options.delay = absl::Milliseconds(absl::GetFlag(FLAGS_delay_ms));
  options.loss = absl::GetFlag(FLAGS_loss_percent) / 100.0;
  options.seed = absl::GetFlag(FLAGS_seed);
  const absl::Status valid = tessera::ValidateWireOptions(options);
  if (names[0].empty() || names[1].empty() || names[0].size() >= IFNAMSIZ ||
      names[1].size() >= IFNAMSIZ || names[0] == names[1] || !valid.ok()) {
    std::fprintf(stderr, "tessera-wire: %s\n",
                 valid.ok() ? "--tun_a and --tun_b must be two different device names of "
                              "1 to 15 characters"
                            : std::string(valid.message()).c_str());
    return 2;
  }
  struct pollfd fds[2];
  for (int end = 0; end < 2; ++end) {
    fds[end].fd = OpenTun(names[end]);
    fds[end].events = POLLIN;
    if (fds[end].fd < 0) return 1;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::fprintf(stderr, "tessera-wire: up: %s <-> %s, delay %s each way, loss %.2f %%\n",
               names[0].c_str(), names[1].c_str(), absl::FormatDuration(options.delay).c_str(),
               options.loss * 100.0);

  tessera::WireCore wire(options);
  std::string buffer(65536, '\0');
  uint64_t write_errors = 0;
  while (!stop) {
    int timeout_ms = 200;  // a stop request is seen within this, nothing in flight
    if (std::optional<absl::Time> next = wire.NextDue()) {
      // Rounded up: a packet never leaves before its time.
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Microseconds(*next - absl::Now()) / 1000 + 1, 0, timeout_ms));
    }
    if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) {
      std::fprintf(stderr, "tessera-wire: poll: %s\n", std::strerror(errno));
      return 1;
    }
    for (int end = 0; end < 2; ++end) {
      if (!(fds[end].revents & POLLIN)) continue;
      for (;;) {
        const ssize_t n = read(fds[end].fd, buffer.data(), buffer.size());
        if (n <= 0) break;  // EAGAIN: drained
        wire.Offer(absl::Now(), static_cast<tessera::WireCore::End>(end),
                   buffer.substr(0, static_cast<size_t>(n)));
      }
    }
    for (tessera::WireCore::Delivery& out : wire.TakeDue(absl::Now())) {
      // A device that is down refuses packets, as a cable that is out delivers none.
      if (write(fds[out.to].fd, out.packet.data(), out.packet.size()) < 0) ++write_errors;
    }
  }
  std::fprintf(stderr, "tessera-wire: stopped: %llu delivered, %llu dropped, %llu not written\n",
               static_cast<unsigned long long>(wire.delivered()),
               static_cast<unsigned long long>(wire.dropped()),
               static_cast<unsigned long long>(write_errors));
  return 0;
}
