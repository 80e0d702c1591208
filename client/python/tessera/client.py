"""tessera.Client: save and load through this rank's Tessera agent (client/client.h)."""

import copy
import ctypes
import json
import os
import struct
import time
import typing
import warnings

from . import _tessera
from . import errors
from . import objects as objects_codec
from .layout import DEFAULT_SPLIT_DIMS, JobLayout
from .shards import KIND_EXTRA, Shard, check_name, to_ref
from .state import check_current, forget_absent_state, write_back_numbers

__all__ = ["Client", "SaveResult"]

# Per-rank extra shards that carry `objects=` (see the package docstring):
OBJECT_PREFIX = "objects."                 # "objects.<name>": one encoded object
HEADER_FQN = "tessera.objects.header"      # 8 bytes: little-endian u64 length of the index
INDEX_FQN = "tessera.objects.index"        # JSON {"format": INDEX_FORMAT, "objects": [[name, nbytes]]}
INDEX_FORMAT = "tessera.objects.index/1"
_MAX_NAME_BYTES = 1000
_NO_SOURCES = {"bytes_from_memory": 0, "bytes_from_disk": 0, "memory_blocks_rejected": 0,
               "bytes_fetched_from_peers": 0, "bytes_verified_by_client": 0,
               "bytes_fetched_by_client": 0, "bytes_checked_ahead": 0, "copy_seconds": 0.0,
               "fetch_seconds": 0.0}


def padded(data):
    """`data` (JSON) padded with spaces — JSON whitespace, ignored when decoding — to a size
    class: a multiple of max(512, 1/8 of the next power of two). Objects whose encoding changes
    length a little between saves (a learning rate printed with more digits) then keep the
    same shard sizes, so the coordinator reuses the job's plan (plan caching). Overhead: at
    most 512 bytes or 12.5 %."""
    n = max(len(data), 1)
    granule = max(512, (1 << (n - 1).bit_length()) // 8)
    return data + b" " * (-len(data) % granule)


class SaveResult(typing.NamedTuple):
    session_id: str
    # How long save() blocked training, in seconds: the whole call, this module's description
    # of the tensors included (the agent's metrics count the native part alone).
    stall_seconds: float
    # The coordinator reused the job's last validated plan (nothing about the tensors changed).
    plan_cached: bool
    # The part of stall_seconds spent copying into staging; the rest waited for the plan, the
    # staging and the agent's acknowledgement. 0 for an overlapped save (copied after it
    # returned; session_id is then "" and plan_cached False: not known yet).
    copy_seconds: float = 0.0
    # An overlapped save with when_busy="skip" that found the previous one still in flight:
    # why it saved nothing; "" otherwise.
    skipped: str = ""


class _Pending:
    """An overlapped save not yet fenced: what must stay alive until its copy is done, and the
    version counter of each saved value at save() (torch bumps it on every in-place write).
    A DTensor's own counter is the one that moves when it is written (an optimizer step, a
    no_grad mul_), not its local tensor's; a Shard's is its tensor's."""

    def __init__(self, step, tensors, keep):
        self.step = step
        self.keep = keep
        self.versions = []
        for k, v in tensors.items():
            t = v.tensor if isinstance(v, Shard) else v
            if hasattr(t, "_version"):
                self.versions.append((k, t, t._version))

    def changed(self):
        """Keys of the tensors written in place since save()."""
        return [k for k, t, v in self.versions if t._version != v]


def _cuda_stream(refs):
    """The address of the current CUDA stream if any ref is a CUDA tensor, else 0."""
    if not any(ref[12] for ref in refs):
        return 0
    import torch  # only here: the package works without torch for host buffers
    return torch.cuda.current_stream().cuda_stream


def _call(fn, *args):
    """Calls the native module, turning its StatusError into a TesseraError subclass."""
    try:
        return fn(*args)
    except _tessera.StatusError as e:
        raise errors.from_status(*e.args) from None


def _step(step, allow_latest):
    if allow_latest and step == "latest":
        return -1  # the latest checkpoint on disk
    if allow_latest and step == "newest":
        return -2  # the newest commit, a memory-only one included
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise errors.malformed("step must be an int >= 0%s, not %r"
                               % (' or "latest" or "newest"' if allow_latest else "", step))
    return step


class _Buffer:
    """Bytes the native client reads or writes: a bytearray and its address."""

    def __init__(self, data=None, size=0):
        self.data = bytearray(data) if data is not None else bytearray(size)
        self._view = (ctypes.c_char * len(self.data)).from_buffer(self.data) if self.data else None

    def ref(self, fqn):
        ptr = ctypes.addressof(self._view) if self._view is not None else 0
        n = len(self.data)
        return (fqn, KIND_EXTRA, "U8", [n], None, None, None, None, "", False, ptr, n, False)


def _check_object_name(name):
    if not isinstance(name, str) or not name:
        raise errors.malformed("objects= names must be non-empty strings, not %r" % (name,))
    check_name(name, "object name", "objects=")
    if len(name.encode("utf-8")) > _MAX_NAME_BYTES or any(
            c in "#@" or ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in name):
        raise errors.malformed("object name %r must be at most %d bytes without '#', '@' or "
                               "control characters" % (name, _MAX_NAME_BYTES))


def _agent_path(agent):
    """`agent` with "{local_rank}" and "{rank}" replaced by torchrun's LOCAL_RANK and RANK
    (python -m tessera.run sets TESSERA_AGENT=<dir>/agent-{local_rank}.sock)."""
    for token, name in (("{local_rank}", "LOCAL_RANK"), ("{rank}", "RANK")):
        if token in agent:
            if name not in os.environ:
                raise errors.InvalidArgumentError(
                    "the agent socket %r names %s, but %s is not set (start the trainer with "
                    "torchrun, or give the path itself)" % (agent, token, name))
            agent = agent.replace(token, os.environ[name])
    return agent


class Client:
    """This trainer process's connection to its Tessera agent.

    Args:
      agent: the agent's unix socket path (or "unix:<path>"); "{local_rank}" and "{rank}" in
        it stand for torchrun's LOCAL_RANK and RANK. Default: $TESSERA_AGENT.
      connect_timeout: seconds to wait for the agent's identity. Default: 10.
      mesh_dims: for DTensors, {DeviceMesh dim name (or index): layout dim, or a tuple of
        layout dims for a flattened mesh dim}. Default: each mesh dim maps to the layout dim
        of the same name (tessera.dtensor, rule 1).
      split_dims: layout dims along which ranks hold different parts of the model; a DTensor
        or a plain tensor next to DTensors is never a replica over them. Default: ("pp",).
      prefetch_resident: where the agent holds a checkpoint in memory (a restart on the same
        node), map it now and fault its pages in on a background thread while the trainer
        builds its model, for a load that reads it in place (DESIGN.md "Mapping the resident
        copy ahead"). Create the client early to overlap the most. Default: True.

    Thread-safety: methods may be called from any thread; save and load are serialised by the
    native client, and all blocking calls release the GIL.

    Raises (constructor): InvalidArgumentError if no socket is given, its path is longer than
    a unix socket path can be, or mesh_dims names a dim the job's layout does not have; UnavailableError if the agent is unreachable or has not
    registered yet (retry); DeadlineExceededError.
    """

    # Class defaults, so that a Client made without __init__ (tests, subclasses) has them.
    _pending = None
    last_fence_error = None

    def __init__(self, agent=None, *, connect_timeout=None, mesh_dims=None,
                 split_dims=DEFAULT_SPLIT_DIMS, prefetch_resident=True):
        agent = _agent_path(agent if agent is not None else os.environ.get("TESSERA_AGENT", ""))
        if not agent:
            raise errors.InvalidArgumentError(
                "no agent socket: pass tessera.Client(agent=...) or set TESSERA_AGENT")
        self._native = _call(_tessera._Client.connect, agent, float(connect_timeout or 0),
                             bool(prefetch_resident))
        self._identity = self._native.identity()
        self._layout = JobLayout(self._identity["layout"], self._identity["coords"],
                                 mesh_dims=mesh_dims, split_dims=split_dims)
        # Keys of the last load's `into` whose optimizer state the checkpoint records absent
        # (their memory was left untouched).
        self.last_absent = []
        # The overlapped save not yet fenced (_Pending), and the error of the last fence that
        # another call implied (save, load, reserve, wait) rather than fence() itself.
        self._pending = None
        self.last_fence_error = None
        # Where the last load's bytes came from (DESIGN.md "Memory tier"): {"bytes_from_memory",
        # "bytes_from_disk", "memory_blocks_rejected", "bytes_fetched_from_peers",
        # "bytes_verified_by_client", "bytes_fetched_by_client", "bytes_checked_ahead",
        # "copy_seconds", "fetch_seconds"}, whole checksum blocks counted;
        # bytes_verified_by_client: bytes this process checked (a load served in place into
        # host memory); bytes_fetched_by_client: of those, bytes it read from another node's
        # agent itself (a lost node's buddy copy); bytes_checked_ahead: of those, bytes it
        # checked after connect, while the model was built, and only copied;
        # copy_seconds: seconds this process spent mapping and copying (and checking) after the
        # agent's replies (LoadResult.copy_time; 0 for bytes it fetched from another node);
        # fetch_seconds: seconds it spent fetching those and checking them as they arrived
        # (LoadResult.fetch_time).
        self.last_load = dict(_NO_SOURCES)

    def __del__(self):
        # The native client first: its destructor ends a pending overlapped save's copy (and
        # withdraws the save) before the tensors that copy reads, held by _pending, are freed.
        self.__dict__.pop("_native", None)

    @property
    def identity(self):
        """{"job", "rank", "coords": {dim: index}, "layout": {dim: degree}, "has_gpu",
        "coordinator"}; coords and layout in mesh order."""
        return copy.deepcopy(self._identity)

    def stats(self):
        """{"saves", "staging_maps", "last_copy_threads", "failed_releases", and of the agent's
        resident checkpoint mapped at connect (DESIGN.md "Mapping and checking the resident copy ahead"):
        "prefetch_bytes" (0: none), "prefetch_populated_bytes", "prefetch_checked_bytes",
        "prefetch_mismatched_blocks", "prefetch_check_error" ("OK", or why nothing was checked
        there), "prefetch_done", "prefetch_s", "prefetched_loads"} of the native client."""
        return self._native.stats()

    def await_prefetch(self, timeout=60.0):
        """Waits until the agent's resident checkpoint, mapped at connect and faulted in in
        the background, is done (or was stopped, or there was none); returns whether it is.
        For benchmarks and tests, which must know when it stops using a core; a trainer need
        not call it."""
        return _call(self._native.await_prefetch, float(timeout))

    def _refs(self, tensors, for_load):
        if tensors is None:
            return [], [], []
        if not hasattr(tensors, "items"):
            raise errors.malformed("tensors must be a mapping of key -> tensor/Shard/Absent, "
                                   "not a %s" % type(tensors).__name__)
        refs, keys, keep = [], [], []
        for key, value in tensors.items():
            ref, tensor = to_ref(key, value, self._layout, for_load)
            refs.append(ref)
            keys.append(key)
            keep.append(tensor)
        return refs, keys, keep

    def save(self, step, tensors, *, objects=None, memory_only=False, overlap=False,
             when_busy="wait"):
        """Saves this rank's share of checkpoint `step`; returns once its bytes are staged (the
        agent persists and commits in the background; see wait()) — or, with overlap=True, at
        once, the copy running in the background until fence().

        Args:
          step: int >= 0.
          tensors: mapping key -> tensor / Shard / Absent (tessera.shards; e.g. flatten_state's
            result): everything this rank holds.
          objects: optional {name: value} of non-tensor state (param groups, scheduler, RNG
            states, data-loader position), stored per rank in the objects encoding.
          memory_only: commit in the agents' memory only, not on disk (DESIGN.md "Memory-only
            saves"): it never becomes "latest", and is lost with the agents holding it. Every
            rank must pass the same.
          overlap: return once the tensors are described (docs/design/overlapped-save.md); the
            tensors are copied while training goes on, and must not be written until fence()
            (call it before the optimizer step; tessera.torch.Checkpointer does). A tensor
            written in place before the fence is caught there (its version counter moved): the
            step is then not committed. Errors after the local checks surface at fence()
            (up to the copy) or wait().
          when_busy: with overlap, what a save does that finds this client's previous
            overlapped save still in flight (a job has one at a time): "wait" (begin once it
            ended, in the background) or "skip" (save nothing: SaveResult.skipped says why,
            stats()["overlap_skips"] counts it, and the step is refused for every rank).

        Returns SaveResult(session_id, stall_seconds, plan_cached, copy_seconds, skipped).

        Raises: InvalidArgumentError — code MALFORMED_SHARD for a tensor that fails the local
        checks (before any RPC; a flatten_state mapping a load left stale: flatten_state), or
        the plan's rejection (DUPLICATE_FQN, INCOMPLETE_COVERAGE,
        OVERLAPPING_SHARDS, SHAPE_MISMATCH, OPTIMIZER_STATE_MISMATCH, ...) before any byte is
        copied; TypeError for an object the encoding refuses; FailedPreconditionError
        (STEP_EXISTS, SESSION_IN_PROGRESS, MEMORY_ONLY_REFUSED: ranks disagree on memory_only
        or an agent's memory tier is off; CUDA tensor without a GPU); AbortedError (the save
        must be restarted); UnavailableError; DeadlineExceededError. What this rank refuses
        of its own state (the local checks, the objects encoding) is passed to the agent
        before it is raised: the other ranks' saves of `step` end at once with its reason.
        """
        start = time.perf_counter()
        self._fence_implied()
        step = _step(step, allow_latest=False)
        try:
            refs, keep = self._save_refs(tensors, objects)
            if not isinstance(memory_only, bool) or not isinstance(overlap, bool):
                raise errors.malformed("memory_only and overlap must be bools, not %r and %r"
                                       % (memory_only, overlap))
            if when_busy not in ("wait", "skip"):
                raise errors.malformed('when_busy must be "wait" or "skip", not %r'
                                       % (when_busy,))
        except (errors.TesseraError, TypeError, ValueError) as refused:
            # This rank will not save `step`: the other ranks' saves end now with its reason
            # (Agent.RefuseSave), not at the planning timeout.
            self._native.refuse(step, getattr(refused, "code", None) or "MALFORMED_SHARD",
                                str(refused))
            raise
        session_id, _, cached, copy, skipped = _call(
            self._native.save, step, refs, memory_only, overlap, when_busy == "skip",
            _cuda_stream(refs) if overlap else 0)
        if overlap and not skipped:
            # The tensors must stay alive, and unwritten, until the copy is done: fence().
            self._pending = _Pending(step, tensors, keep)
        del keep  # otherwise the tensors had to stay alive until here
        return SaveResult(session_id, time.perf_counter() - start, cached, copy, skipped)

    def fence(self):
        """Ends the overlap of the last save(overlap=True): waits until its tensors are copied
        (usually long done), checks that none was written in place since save() (their
        version counters), and lets the save commit. Returns at once if no save is pending.
        Call it before the state changes again: the optimizer step (tessera.torch.Checkpointer
        installs it as a step pre-hook), an EMA update, a load into the same tensors.

        Raises: AbortedError with code STATE_CHANGED naming the tensors written before the
        fence (the step is then withdrawn: never committed, for every rank); the save's own
        error if it ended before its copy (the plan's rejection, AbortedError, ...).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        changed = pending.changed()
        why = ""
        if changed:
            why = ("%d tensor(s) were written in place between save(%d, overlap=True) and its "
                   "fence, so the copy may hold part of the change: %s. Fence before changing "
                   "the state (tessera.Client.fence(), or Checkpointer.fence()); the step is not "
                   "committed" % (len(changed), pending.step,
                                  ", ".join(ascii(k) for k in changed[:5])
                                  + (", ..." if len(changed) > 5 else "")))
        _call(self._native.fence, why)

    def _fence_implied(self):
        """fence() before another call uses the staging or the session; its error is warned
        about and kept in last_fence_error, not raised (the call is not about that save)."""
        if self._pending is None:
            return
        try:
            self.fence()
        except errors.TesseraError as e:
            self.last_fence_error = e
            warnings.warn("tessera: overlapped save was not committed: %s" % (e,),
                          RuntimeWarning, stacklevel=3)

    def reserve(self, tensors, *, objects=None):
        """Makes the agent create (and this process map) the staging that saves of `tensors`
        need, now: the first save then stalls for its copy alone instead of also creating and
        faulting in its shared memory (seconds per ten GiB). Optional; call it once the model
        and optimizer state exist (after a load, or before the first step). Arguments as
        save(). A DP leader's save also stages its peers' optimizer slices, which only the
        plan tells: its first save still makes a larger region.

        Raises: InvalidArgumentError if the tensors hold no bytes, or as save() for a tensor
        that fails the local checks; ResourceExhaustedError (ADMISSION_DENIED over the agent's
        staging budget, IO_ERROR when /dev/shm is full); UnavailableError.
        """
        self._fence_implied()
        refs, keep = self._save_refs(tensors, objects)
        _call(self._native.reserve, refs)
        del keep

    def _save_refs(self, tensors, objects):
        """The refs a save of `tensors` and `objects` stages, and what must stay alive until
        the copy is done: (tensors, buffers)."""
        check_current(tensors)
        refs, _, keep = self._refs(tensors, for_load=False)
        buffers = []
        index = []
        for name, value in (objects or {}).items():
            _check_object_name(name)
            buf = _Buffer(padded(objects_codec.encode(value, "objects[%r]" % name)))
            buffers.append((OBJECT_PREFIX + name, buf))
            index.append([name, len(buf.data)])
        index_buf = _Buffer(padded(json.dumps({"format": INDEX_FORMAT,
                                               "objects": index}).encode()))
        header_buf = _Buffer(struct.pack("<Q", len(index_buf.data)))
        buffers += [(INDEX_FQN, index_buf), (HEADER_FQN, header_buf)]
        refs += [buf.ref(fqn) for fqn, buf in buffers]
        return refs, (keep, buffers)

    def wait(self, step, timeout=None):
        """Blocks until checkpoint `step` is committed; returns its directory, or "" for a
        memory-only save (it has none: it lives in the agents' memory; load it by its step).

        Raises: AbortedError with the session's reason (AGENT_LOST, REPLICA_DIVERGED, IO_ERROR,
        ...); DeadlineExceededError after `timeout` seconds (None: no limit);
        NotFoundError if the agent knows no save of `step`; UnavailableError.
        """
        step = _step(step, allow_latest=False)
        self._fence_implied()
        if timeout is not None:
            timeout = float(timeout)
            if not timeout > 0:
                raise errors.malformed("timeout must be positive seconds or None, not %r"
                                       % timeout)
        return _call(self._native.wait, step, timeout)

    def load(self, step="latest", into=None, *, objects=False):
        """Loads checkpoint `step` into the tensors of `into` (same mapping form as save; loaded
        in place, resharded to the current layout). `step`: a step (its disk checkpoint, else its
        memory-only commit), "latest" (the latest on disk) or "newest" (the newest commit, a
        memory-only one included).

        Returns the step loaded; with objects=True, (step, {name: value}) with this rank's
        objects as saved. Keys of `into` whose optimizer state the checkpoint records as absent
        are left untouched and listed in last_absent; if `into` is the mapping flatten_state
        returned, a parameter all of whose state came back absent also has its optimizer state
        dropped (the placeholder tessera.init_optimizer_state made) and its entries in `into`
        replaced by its ``"<fqn>#"`` Absent marker (flatten_state).

        Raises: NotFoundError (CHECKPOINT_NOT_FOUND; MEMORY_COPY_LOST: a memory-only step some
        data file of which no live agent holds); InvalidArgumentError — MALFORMED_SHARD for
        a bad destination (non-contiguous, read-only, a tensor subclass, tessera.Absent: a
        frozen parameter's ``"<fqn>#"`` entry must be left out of `into`), a tensor missing from the
        checkpoint or of another shape (SHAPE_MISMATCH), or (objects=True) a checkpoint that
        holds no objects of this rank; DataLossError (CHECKSUM_MISMATCH); UnavailableError;
        DeadlineExceededError. With objects=True, nothing is written into `into` unless the
        objects could be read.
        """
        step = _step(step, allow_latest=True)
        self._fence_implied()  # a load may write into tensors a pending save still reads
        refs, keys, keep = self._refs(into, for_load=True)
        names = []
        blobs = []
        sources = dict(_NO_SOURCES)

        def native_load(step, refs):
            loaded, absent, found = _call(self._native.load, step, refs)
            for k in sources:
                sources[k] += found[k]
            return loaded, absent

        if objects:
            header = _Buffer(size=8)
            rank = self._identity["rank"]
            try:
                step, absent = native_load(step, [header.ref(HEADER_FQN)])
            except errors.InvalidArgumentError as e:
                raise errors.InvalidArgumentError(
                    "the checkpoint holds no objects for rank %d (it was not saved by tessera's "
                    "Python client on this rank): %s" % (rank, e.message),
                    code=e.code, status_code=e.status_code, fqns=e.fqns, ranks=e.ranks) from None
            if absent:
                # The agent reports the extras of a rank that did not save the step absent.
                raise errors.InvalidArgumentError(
                    "the checkpoint holds no objects for rank %d: no rank %d saved step %d (it "
                    "was saved by fewer ranks); supply this rank's objects from elsewhere, or "
                    "load without objects=True" % (rank, rank, step), fqns=[HEADER_FQN])
            (index_size,) = struct.unpack("<Q", bytes(header.data))
            index_buf = _Buffer(size=index_size)
            native_load(step, [index_buf.ref(INDEX_FQN)])
            index = json.loads(bytes(index_buf.data).decode("utf-8"))
            if index.get("format") != INDEX_FORMAT:
                raise errors.DataLossError("unknown objects index format %r" % index.get("format"))
            for name, size in index["objects"]:
                names.append(name)
                blobs.append(_Buffer(size=size))
            refs = refs + [b.ref(OBJECT_PREFIX + n) for n, b in zip(names, blobs)]
        loaded, absent = native_load(step, refs)
        del keep
        self.last_absent = [keys[i] for i in absent if i < len(keys)]
        self.last_load = sources
        write_back_numbers(into or {})
        forget_absent_state(into, self.last_absent)
        if not objects:
            return loaded
        return loaded, {n: objects_codec.decode(b.data, "objects[%r]" % n)
                        for n, b in zip(names, blobs)}

    def latest(self):
        """The latest step on disk, or None if there is none: what load("latest") loads (a
        newer memory-only commit is load("newest")'s). It loads nothing, and leaves the
        resident copy's mapping made at connect to go on for the load that follows.

        Raises: UnavailableError; DeadlineExceededError.
        """
        try:
            step, _, _ = _call(self._native.load, -1, [])
        except errors.NotFoundError as e:
            if e.code == "CHECKPOINT_NOT_FOUND":
                return None
            raise
        return step
