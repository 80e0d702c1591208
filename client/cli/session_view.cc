#include "client/cli/session_view.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cli/format_util.h"
#include "client/cli/table.h"
#include "common/box.h"
#include "common/status.h"

namespace tessera {
namespace cli {
namespace {

constexpr v1::SessionState kPhases[] = {
    v1::SESSION_STATE_PLANNING,   v1::SESSION_STATE_PINNING,    v1::SESSION_STATE_COPYING,
    v1::SESSION_STATE_PERSISTING, v1::SESSION_STATE_COMMITTING,
};

// True if a rank whose last completed phase is `reached` has completed `phase`.
bool Completed(v1::SessionState reached, v1::SessionState phase) {
  return reached != v1::SESSION_STATE_ABORTED && reached >= phase;
}

int RanksDone(const v1::SessionStatus& status, v1::SessionState phase) {
  int done = 0;
  for (const v1::RankProgress& r : status.ranks()) done += Completed(r.reached(), phase);
  return done;
}

const v1::PhaseTiming* FindPhase(const v1::SessionStatus& status, v1::SessionState state) {
  const v1::PhaseTiming* found = nullptr;
  for (const v1::PhaseTiming& p : status.phases()) {
    if (p.state() == state) found = &p;  // the last entry wins
  }
  return found;
}

// The phase the session is in, or was in when it aborted (the last non-terminal phase it
// entered); UNSPECIFIED if none is known.
v1::SessionState ActivePhase(const v1::SessionStatus& status) {
  if (!IsTerminal(status.state())) return status.state();
  if (status.state() == v1::SESSION_STATE_COMMITTED) return v1::SESSION_STATE_UNSPECIFIED;
  v1::SessionState last = v1::SESSION_STATE_UNSPECIFIED;
  for (const v1::PhaseTiming& p : status.phases()) {
    if (!IsTerminal(p.state()) && p.state() != v1::SESSION_STATE_UNSPECIFIED) last = p.state();
  }
  return last;
}

uint64_t BytesStaged(const v1::SessionStatus& status) {
  uint64_t total = 0;
  for (const v1::RankProgress& r : status.ranks()) total += r.bytes_staged();
  return total;
}

uint64_t MaxStallNs(const v1::SessionStatus& status) {
  uint64_t stall = 0;
  for (const v1::RankProgress& r : status.ranks()) stall = std::max(stall, r.trainer_stall_ns());
  return stall;
}

std::string WrittenSummary(const v1::SessionStatus& status) {
  return absl::StrCat(FormatBytes(status.bytes_written()), " / ", FormatBytes(status.bytes_total()),
                      " written, chunks ", status.chunks_reported(), "/", status.chunks_total());
}

std::string RanksSummary(const v1::SessionStatus& status, v1::SessionState phase) {
  return absl::StrCat("ranks ", RanksDone(status, phase), "/", status.ranks_size());
}

std::string Header(const v1::SessionStatus& status) {
  std::string line = absl::StrCat("job ", status.job_id(), "  step ", status.step(), "  session ",
                                  status.session_id(), "  state ", StateName(status.state()));
  if (status.plan_cached()) line += "  (plan cached)";
  return line;
}

}  // namespace

bool IsTerminal(v1::SessionState state) {
  return state == v1::SESSION_STATE_COMMITTED || state == v1::SESSION_STATE_ABORTED;
}

void PrintErrorDetail(const v1::ErrorDetail& error, std::ostream& out, absl::string_view indent) {
  out << indent << ErrorCodeName(error.code()) << ": " << error.message() << '\n';
  if (error.ranks_size() > 0) {
    std::vector<std::string> ranks;
    for (const v1::RankRef& r : error.ranks()) {
      ranks.push_back(r.coords().empty() ? absl::StrCat(r.rank())
                                         : absl::StrCat(r.rank(), " (", r.coords(), ")"));
    }
    out << indent << "  ranks: " << absl::StrJoin(ranks, ", ") << '\n';
  }
  if (error.fqns_size() > 0) {
    out << indent << "  tensors: " << absl::StrJoin(error.fqns(), ", ") << '\n';
  }
  if (error.has_region()) {
    out << indent << "  region: " << BoxToString(BoxFromProto(error.region())) << '\n';
  }
  if (!error.state_key().empty()) out << indent << "  state key: " << error.state_key() << '\n';
  if (!error.path().empty()) out << indent << "  path: " << error.path() << '\n';
}

void PrintSessionStatus(const v1::SessionStatus& status, std::ostream& out) {
  out << Header(status) << '\n';
  out << "started " << FormatUnixMs(status.started_unix_ms()) << '\n';
  out << "written " << ProgressBar(status.bytes_written(), status.bytes_total(), 30) << ' '
      << FormatPercent(status.bytes_written(), status.bytes_total()) << "  "
      << WrittenSummary(status) << '\n';
  if (status.state() == v1::SESSION_STATE_COMMITTED) {
    out << "checkpoint " << status.checkpoint_dir() << '\n';
  }
  if (status.state() == v1::SESSION_STATE_ABORTED) {
    out << "\naborted: ";
    PrintErrorDetail(status.error(), out);
  }

  if (status.ranks_size() > 0) {
    out << '\n';
    Table ranks({"RANK", "COORDS", "REACHED", "STAGED", "PLANNED", "WRITTEN", "CHUNKS", "STALL",
                 "STRAGGLER"});
    for (size_t c : {0, 3, 4, 5, 6, 7}) ranks.AlignRight(c);
    std::vector<const v1::RankProgress*> sorted;
    for (const v1::RankProgress& r : status.ranks()) sorted.push_back(&r);
    std::sort(sorted.begin(), sorted.end(),
              [](const auto* a, const auto* b) { return a->rank() < b->rank(); });
    for (const v1::RankProgress* r : sorted) {
      ranks.AddRow({absl::StrCat(r->rank()), r->coords(), StateName(r->reached()),
                    FormatBytes(r->bytes_staged()), FormatBytes(r->bytes_planned()),
                    FormatBytes(r->bytes_written()), absl::StrCat(r->chunks_reported()),
                    HumanDuration(absl::Nanoseconds(r->trainer_stall_ns())),
                    r->straggler() ? "yes" : ""});
    }
    ranks.Print(out);
  }

  if (status.phases_size() > 0) {
    out << '\n';
    Table phases({"PHASE", "ENTERED", "DURATION"});
    phases.AlignRight(2);
    for (const v1::PhaseTiming& p : status.phases()) {
      std::string duration;
      if (IsTerminal(p.state())) {
        duration = "-";
      } else if (p.duration_ms() == 0 && p.state() == status.state()) {
        duration = "in progress";
      } else {
        duration = HumanDuration(absl::Milliseconds(p.duration_ms()));
      }
      phases.AddRow({StateName(p.state()), FormatUnixMs(p.entered_unix_ms()), duration});
    }
    phases.Print(out);
  }
}

std::string WatchFrame(const v1::SessionStatus& status, int bar_width) {
  std::string frame = Header(status) + "\n";
  const v1::SessionState active = ActivePhase(status);
  const bool committed = status.state() == v1::SESSION_STATE_COMMITTED;
  Table table({"", "", ""});
  for (v1::SessionState phase : kPhases) {
    const v1::PhaseTiming* timing = FindPhase(status, phase);
    std::string what;
    std::string detail;
    if (committed || (active != v1::SESSION_STATE_UNSPECIFIED && phase < active)) {
      what = "done";
      if (timing != nullptr) {
        absl::StrAppend(&what, " ", HumanDuration(absl::Milliseconds(timing->duration_ms())));
      }
      if (phase == v1::SESSION_STATE_PLANNING && status.plan_cached()) detail = "plan cached";
      if (phase == v1::SESSION_STATE_COPYING) {
        detail = absl::StrCat(FormatBytes(BytesStaged(status)), " staged, max trainer stall ",
                              HumanDuration(absl::Nanoseconds(MaxStallNs(status))));
      }
      if (phase == v1::SESSION_STATE_PERSISTING) detail = WrittenSummary(status);
    } else if (phase == active) {
      if (phase == v1::SESSION_STATE_PERSISTING) {
        what = absl::StrCat(ProgressBar(status.bytes_written(), status.bytes_total(), bar_width),
                            " ", FormatPercent(status.bytes_written(), status.bytes_total()));
        detail = absl::StrCat(WrittenSummary(status), ", ", RanksSummary(status, phase));
      } else {
        const uint64_t done = RanksDone(status, phase);
        what = absl::StrCat(ProgressBar(done, status.ranks_size(), bar_width), " ",
                            FormatPercent(done, status.ranks_size()));
        detail = RanksSummary(status, phase);
        if (phase == v1::SESSION_STATE_COPYING) {
          absl::StrAppend(&detail, ", ", FormatBytes(BytesStaged(status)), " staged");
        }
      }
      if (status.state() == v1::SESSION_STATE_ABORTED) detail += "  ABORTED";
    } else {
      what = "pending";
    }
    table.AddRow({StateName(phase), what, detail});
  }
  std::ostringstream body;
  table.Print(body, "  ");
  // Drop the (empty) header line of the table: the frame's first line is the session header.
  std::string text = body.str();
  frame += text.substr(text.find('\n') + 1);
  if (committed) {
    absl::StrAppend(&frame, "COMMITTED: checkpoint ", status.checkpoint_dir(), "\n");
  } else if (status.state() == v1::SESSION_STATE_ABORTED) {
    absl::StrAppend(&frame, "ABORTED: ", ErrorCodeName(status.error().code()), ": ",
                    status.error().message(), "\n");
  }
  return frame;
}

std::string WatchLine(const v1::SessionStatus& status) {
  std::string line = absl::StrCat("step ", status.step(), " ", StateName(status.state()));
  switch (status.state()) {
    case v1::SESSION_STATE_PERSISTING:
      absl::StrAppend(&line, " ", FormatPercent(status.bytes_written(), status.bytes_total()), " ",
                      WrittenSummary(status), ", ", RanksSummary(status, status.state()));
      break;
    case v1::SESSION_STATE_COMMITTED:
      absl::StrAppend(&line, " ", FormatBytes(status.bytes_written()), " in ",
                      status.chunks_reported(), " chunks, checkpoint ", status.checkpoint_dir());
      break;
    case v1::SESSION_STATE_ABORTED:
      absl::StrAppend(&line, " ", ErrorCodeName(status.error().code()), ": ",
                      status.error().message());
      break;
    case v1::SESSION_STATE_COPYING:
      absl::StrAppend(&line, " ", RanksSummary(status, status.state()), ", ",
                      FormatBytes(BytesStaged(status)), " staged");
      break;
    default:
      absl::StrAppend(&line, " ", RanksSummary(status, status.state()));
      break;
  }
  return line;
}

}  // namespace cli
}  // namespace tessera
