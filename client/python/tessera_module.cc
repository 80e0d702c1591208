// _tessera: the pybind11 extension under the Python package `tessera` (client/python/tessera).
// A thin adapter over tessera::Client (client/client.h); everything torch- or numpy-specific
// (dtypes, devices, contiguity, sharding metadata, the objects encoding) is pure Python in
// the package, which hands this module plain tuples. It does not link libtorch: a tensor
// arrives as a data pointer, a byte count and a memory kind.
//
// A tensor reference is the 13-tuple
//   (fqn: str, kind: int (types.proto ShardKind), dtype: str (safetensors name, "F32"),
//    global_shape: list[int], offsets: list[int] | None, lengths: list[int] | None,
//    flat_range: (int, int) | None, replicated_over: list[str] | None, state_key: str,
//    state_absent: bool, data_ptr: int, nbytes: int, cuda: bool)
// The caller keeps the memory behind data_ptr alive and unchanged for the call.
//
// Errors: every absl::Status error is raised as _tessera.StatusError with args
// (error_code_name, status_code_name, message, detail), where error_code_name is
// common/status.h ErrorCodeName of the payload ("DUPLICATE_FQN"; "UNSPECIFIED" without one),
// status_code_name is absl's ("INVALID_ARGUMENT") and detail is a dict of the ErrorDetail's
// fqns, ranks, state_key and path. The package turns it into a tessera.TesseraError subclass.
// A malformed tuple raises TypeError / ValueError.
//
// Thread-safety: _Client methods may be called from any Python thread; save, load and wait
// release the GIL while they block (tessera::Client serialises save and load itself).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/describe.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/shard_rules.h"
#include "common/status.h"
#include "pybind11/pybind11.h"
#include "pybind11/stl.h"

namespace py = pybind11;

namespace tessera {
namespace {

// The module's StatusError type, created at import.
PyObject* g_status_error = nullptr;

// Raises `status` (not OK) as _tessera.StatusError.
[[noreturn]] void RaiseStatus(const absl::Status& status) {
  const v1::ErrorCode code = GetErrorCode(status);
  py::dict detail;
  py::list fqns;
  py::list ranks;
  std::string state_key;
  std::string path;
  if (std::optional<v1::ErrorDetail> d = GetErrorDetail(status); d.has_value()) {
    for (const std::string& f : d->fqns()) fqns.append(f);
    for (const v1::RankRef& r : d->ranks()) ranks.append(py::make_tuple(r.rank(), r.coords()));
    state_key = d->state_key();
    path = d->path();
  }
  detail["fqns"] = fqns;
  detail["ranks"] = ranks;
  detail["state_key"] = state_key;
  detail["path"] = path;
  const std::string code_name =
      code == v1::ERROR_CODE_UNSPECIFIED ? std::string("UNSPECIFIED") : ErrorCodeName(code);
  py::tuple args = py::make_tuple(code_name, absl::StatusCodeToString(status.code()),
                                  std::string(status.message()), detail);
  PyErr_SetObject(g_status_error, args.ptr());
  throw py::error_already_set();
}

template <typename T>
T ValueOrRaise(absl::StatusOr<T> value) {
  if (!value.ok()) RaiseStatus(value.status());
  return *std::move(value);
}

// Converts one reference tuple (see the header comment). Raises ValueError naming the index.
TensorRef RefFromTuple(size_t index, const py::handle& item) {
  auto bad = [&](const std::string& why) {
    return py::value_error("tensor reference " + std::to_string(index) + ": " + why);
  };
  py::tuple t = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
  if (t.size() != 13) throw bad("expected a 13-tuple, got " + std::to_string(t.size()));
  TensorRef ref;
  ref.fqn = t[0].cast<std::string>();
  const int kind = t[1].cast<int>();
  if (!v1::ShardKind_IsValid(kind)) throw bad("unknown kind " + std::to_string(kind));
  ref.kind = static_cast<v1::ShardKind>(kind);
  const std::string dtype_name = t[2].cast<std::string>();
  absl::StatusOr<v1::DType> dtype = DTypeFromName(dtype_name);
  if (!dtype.ok()) throw bad("unknown dtype \"" + dtype_name + "\"");
  ref.dtype = *dtype;
  ref.global_shape = t[3].cast<std::vector<int64_t>>();
  if (!t[4].is_none()) ref.box.offsets = t[4].cast<std::vector<int64_t>>();
  if (!t[5].is_none()) ref.box.lengths = t[5].cast<std::vector<int64_t>>();
  if (!t[6].is_none()) ref.flat_range = t[6].cast<std::pair<int64_t, int64_t>>();
  if (!t[7].is_none()) ref.replicated_over = t[7].cast<std::vector<std::string>>();
  ref.state_key = t[8].cast<std::string>();
  ref.state_absent = t[9].cast<bool>();
  ref.data = reinterpret_cast<void*>(t[10].cast<uintptr_t>());
  ref.nbytes = t[11].cast<size_t>();
  ref.memory = t[12].cast<bool>() ? Memory::kCuda : Memory::kHost;
  return ref;
}

std::vector<TensorRef> RefsFromList(const py::sequence& refs) {
  std::vector<TensorRef> out;
  out.reserve(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) out.push_back(RefFromTuple(i, refs[i]));
  return out;
}

// Owns the connection to this rank's agent.
class PyClient {
 public:
  static std::unique_ptr<PyClient> Connect(const std::string& socket, double get_info_timeout_s,
                                           bool prefetch_resident) {
    ClientOptions options;
    if (get_info_timeout_s > 0) options.get_info_timeout = absl::Seconds(get_info_timeout_s);
    options.prefetch_resident = prefetch_resident;
    absl::StatusOr<std::unique_ptr<Client>> client;
    {
      py::gil_scoped_release release;
      client = Client::Connect(socket, options);
    }
    return std::make_unique<PyClient>(ValueOrRaise(std::move(client)));
  }

  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  // {"job", "rank", "coords": {dim: index}, "layout": {dim: degree}, "has_gpu",
  //  "coordinator"}; dicts in mesh order.
  py::dict Identity() const {
    const v1::AgentIdentity& id = client_->identity();
    py::dict coords;
    py::dict layout;
    for (int i = 0; i < id.layout().dims_size(); ++i) {
      const v1::MeshDim& dim = id.layout().dims(i);
      layout[py::str(dim.name())] = dim.degree();
      if (i < id.coord().index_size()) coords[py::str(dim.name())] = id.coord().index(i);
    }
    py::dict out;
    out["job"] = id.job_id();
    out["rank"] = id.coord().rank();
    out["coords"] = coords;
    out["layout"] = layout;
    out["has_gpu"] = id.has_gpu();
    out["coordinator"] = id.coordinator();
    return out;
  }

  // Returns (session_id, stall_seconds, plan_cached, copy_seconds, skipped). With `overlap`
  // (SaveOptions::overlap): `skip_when_busy` picks WhenBusy::kSkip, `cuda_stream` is the
  // cudaStream_t (an address; 0: the legacy default stream) the copy must follow.
  py::tuple Save(int64_t step, const py::sequence& refs, bool memory_only, bool overlap,
                 bool skip_when_busy, uintptr_t cuda_stream) {
    std::vector<TensorRef> tensors = RefsFromList(refs);
    absl::StatusOr<SaveResult> result;
    {
      py::gil_scoped_release release;
      SaveOptions options;
      options.memory_only = memory_only;
      options.overlap = overlap;
      options.when_busy =
          skip_when_busy ? SaveOptions::WhenBusy::kSkip : SaveOptions::WhenBusy::kWait;
      options.cuda_stream = reinterpret_cast<void*>(cuda_stream);
      result = client_->Save(step, tensors, options);
    }
    SaveResult r = ValueOrRaise(std::move(result));
    return py::make_tuple(r.session_id, absl::ToDoubleSeconds(r.stall), r.plan_cached,
                          absl::ToDoubleSeconds(r.copy), r.skipped);
  }

  // Client::Fence. `changed`: empty if the state stayed intact since the save, else why not
  // (the verdict STATE_CHANGED). Raises StatusError with what ended the save, or the verdict.
  void Fence(const std::string& changed) {
    absl::Status verdict;
    if (!changed.empty()) {
      verdict = MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_STATE_CHANGED, changed);
    }
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Fence(verdict);
    }
    if (!status.ok()) RaiseStatus(status);
  }

  // Client::RefuseSave: this rank's Python-side checks refused its state for `step`; `code`
  // is an ErrorCode name without its prefix ("MALFORMED_SHARD"). Best effort: never raises.
  void Refuse(int64_t step, const std::string& code, const std::string& message) {
    v1::ErrorCode reason = v1::ERROR_CODE_MALFORMED_SHARD;
    if (!v1::ErrorCode_Parse("ERROR_CODE_" + code, &reason) ||
        reason == v1::ERROR_CODE_UNSPECIFIED) {
      reason = v1::ERROR_CODE_MALFORMED_SHARD;
    }
    py::gil_scoped_release release;
    client_->RefuseSave(step, MakeError(absl::StatusCode::kInvalidArgument, reason, message))
        .IgnoreError();  // the caller raises its own error; RefuseSave logged the rest
  }

  void Reserve(const py::sequence& refs) {
    std::vector<TensorRef> tensors = RefsFromList(refs);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->ReserveStaging(tensors);
    }
    if (!status.ok()) RaiseStatus(status);
  }

  // Returns the checkpoint directory. `timeout_s` None: no limit.
  std::string Wait(int64_t step, std::optional<double> timeout_s) {
    const absl::Duration timeout =
        timeout_s.has_value() ? absl::Seconds(*timeout_s) : absl::InfiniteDuration();
    absl::StatusOr<std::string> dir;
    {
      py::gil_scoped_release release;
      dir = client_->WaitCommitted(step, timeout);
    }
    return ValueOrRaise(std::move(dir));
  }

  // Returns (step loaded, indices of `refs` recorded absent, {"bytes_from_memory",
  // "bytes_from_disk", "memory_blocks_rejected", "bytes_fetched_from_peers",
  // "bytes_verified_by_client", "bytes_fetched_by_client", "bytes_checked_ahead",
  // "copy_seconds", "fetch_seconds"}).
  py::tuple Load(int64_t step, const py::sequence& refs) {
    std::vector<TensorRef> into = RefsFromList(refs);
    absl::StatusOr<LoadResult> result;
    {
      py::gil_scoped_release release;
      result = client_->Load(step, into);
    }
    LoadResult r = ValueOrRaise(std::move(result));
    py::list absent;
    for (size_t i : r.absent) absent.append(i);
    py::dict sources;
    sources["bytes_from_memory"] = r.bytes_from_memory;
    sources["bytes_from_disk"] = r.bytes_from_disk;
    sources["memory_blocks_rejected"] = r.memory_blocks_rejected;
    sources["bytes_fetched_from_peers"] = r.bytes_fetched_from_peers;
    sources["bytes_verified_by_client"] = r.bytes_verified_by_client;
    sources["bytes_fetched_by_client"] = r.bytes_fetched_by_client;
    sources["bytes_checked_ahead"] = r.checked_ahead_bytes;
    sources["copy_seconds"] = absl::ToDoubleSeconds(r.copy_time);
    sources["fetch_seconds"] = absl::ToDoubleSeconds(r.fetch_time);
    return py::make_tuple(r.step, absent, sources);
  }

  py::dict Stats() const {
    const ClientStats s = client_->stats();
    py::dict out;
    out["saves"] = s.saves;
    out["staging_maps"] = s.staging_maps;
    out["last_copy_threads"] = s.last_copy_threads;
    out["failed_releases"] = s.failed_releases;
    out["prefetch_bytes"] = s.prefetch_bytes;
    out["prefetch_populated_bytes"] = s.prefetch_populated_bytes;
    out["prefetch_checked_bytes"] = s.prefetch_checked_bytes;
    out["prefetch_mismatched_blocks"] = s.prefetch_mismatched_blocks;
    out["prefetch_check_error"] = std::string(s.prefetch_check_status.ToString());
    out["prefetch_done"] = s.prefetch_done;
    out["prefetch_s"] = absl::ToDoubleSeconds(s.prefetch_time);
    out["prefetched_loads"] = s.prefetched_loads;
    out["overlapped_saves"] = s.overlapped_saves;
    out["overlap_skips"] = s.overlap_skips;
    out["overlap_refused"] = s.overlap_refused;
    return out;
  }

  // Client::AwaitPrefetch, the GIL released.
  bool AwaitPrefetch(double timeout_s) {
    py::gil_scoped_release release;
    return client_->AwaitPrefetch(absl::Seconds(timeout_s));
  }

 private:
  std::unique_ptr<Client> client_;
};

// Checks `refs` as Save would before any RPC (client/describe.h DescribeShards) against a
// mesh given as [(name, degree), ...]; raises StatusError for the first bad piece. Lets the
// package's unit tests exercise the C++ checks without an agent.
void Describe(const std::vector<std::pair<std::string, uint32_t>>& mesh, const py::sequence& refs) {
  v1::Layout layout;
  for (const auto& [name, degree] : mesh) {
    v1::MeshDim* dim = layout.add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  std::vector<TensorRef> tensors = RefsFromList(refs);
  absl::StatusOr<std::vector<v1::ShardDesc>> shards = DescribeShards(layout, tensors);
  if (!shards.ok()) RaiseStatus(shards.status());
}

// The shard rules' box and flat-range checks (common/shard_rules.h CheckBoxAndRange) for the
// package's Shard and Absent, so that Python keeps no copy of them: raises StatusError
// MALFORMED_SHARD with the rules' reason after "`where`: ". Returns the box's volume.
int64_t CheckBox(const std::string& where, const std::vector<int64_t>& global_shape,
                 const std::vector<int64_t>& offsets, const std::vector<int64_t>& lengths,
                 std::optional<std::pair<int64_t, int64_t>> flat_range) {
  absl::StatusOr<int64_t> elements = CheckBoxAndRange(global_shape, offsets, lengths, flat_range);
  if (!elements.ok()) {
    RaiseStatus(MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_MALFORMED_SHARD,
                          absl::StrCat(where, ": ", elements.status().message())));
  }
  return *elements;
}

}  // namespace
}  // namespace tessera

PYBIND11_MODULE(_tessera, m) {
  m.doc() = "Native half of the `tessera` package; use the package, not this module.";
  static py::exception<void> status_error(m, "StatusError", PyExc_RuntimeError);
  tessera::g_status_error = status_error.ptr();

  py::class_<tessera::PyClient>(m, "_Client")
      .def_static("connect", &tessera::PyClient::Connect, py::arg("socket"),
                  py::arg("get_info_timeout_s") = 0.0, py::arg("prefetch_resident") = true)
      .def("identity", &tessera::PyClient::Identity)
      .def("save", &tessera::PyClient::Save, py::arg("step"), py::arg("refs"),
           py::arg("memory_only") = false, py::arg("overlap") = false,
           py::arg("skip_when_busy") = false, py::arg("cuda_stream") = 0)
      .def("fence", &tessera::PyClient::Fence, py::arg("changed"))
      .def("refuse", &tessera::PyClient::Refuse, py::arg("step"), py::arg("code"),
           py::arg("message"))
      .def("reserve", &tessera::PyClient::Reserve, py::arg("refs"))
      .def("wait", &tessera::PyClient::Wait, py::arg("step"), py::arg("timeout_s"))
      .def("load", &tessera::PyClient::Load, py::arg("step"), py::arg("refs"))
      .def("stats", &tessera::PyClient::Stats)
      .def("await_prefetch", &tessera::PyClient::AwaitPrefetch, py::arg("timeout_s"));
  m.def("describe", &tessera::Describe, py::arg("mesh"), py::arg("refs"));
  m.def("check_box", &tessera::CheckBox, py::arg("where"), py::arg("global_shape"),
        py::arg("offsets"), py::arg("lengths"), py::arg("flat_range"));
}
