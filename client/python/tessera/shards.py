"""How a trainer describes the tensors it saves or loads: plain tensors, DTensors, Shard, Absent.

A mapping passed to ``Client.save`` / ``Client.load`` goes from a key to one of:

* a CPU or CUDA ``torch.Tensor`` or a ``numpy.ndarray``: the whole tensor. Under a key
  ``"<fqn>"`` it is a parameter (or buffer); under ``"<fqn>#<state_key>"`` it is optimizer
  state of parameter ``<fqn>`` (the manifest's own key form; '#' never occurs in an fqn);
* a DTensor (FSDP2, tensor parallelism, ``distribute_tensor``): its box and replicas follow
  from its placements and the job's layout (tessera.dtensor has the rules);
* a :class:`Shard`: a piece of a larger tensor, described explicitly;
* an :class:`Absent`: "this rank has no optimizer state for the parameter yet" (save only).

``replicated_over`` left as None means: ``["dp"]`` when the job's mesh has a ``dp`` dim and the
piece has no flat range, else ``[]`` — for parameters and optimizer state alike (plain DDP
replicates both over dp; a distributed optimizer's flat-range slices are not replicas).
``replicated_over="*"`` (ALL_DIMS) means every dim of the job's mesh: a value every holder
shares, such as the step count of a sharded parameter's optimizer state.
``replicated_over="*model"`` (MODEL_REPLICA) means every dim of the job's mesh but its split
dims (``pp``; tessera.layout): how a plain tensor next to DTensors is held — every rank of a
pipeline stage has the same copy (a buffer, an optimizer step count).

Memory rules: a tensor must be C-contiguous, strided, on the CPU or a CUDA device, of a dtype
listed in ``DTYPES``. Nothing is copied implicitly: a non-contiguous tensor is refused (for
a load, a copy would silently receive the data instead of the tensor; for a save it would
double the memory and the stall) — pass ``t.contiguous()`` yourself when saving.
"""

import math

from . import dtensor as dtensors
from . import errors
from .layout import JobLayout

__all__ = ["Shard", "Absent", "DTYPES", "ALL_DIMS", "MODEL_REPLICA"]

# replicated_over=ALL_DIMS: a replica over every dim of the job's mesh (resolved in to_ref).
ALL_DIMS = "*"
# replicated_over=MODEL_REPLICA: every dim of the job's mesh but its split dims (pp).
MODEL_REPLICA = "*model"

# types.proto ShardKind.
KIND_PARAM = 1
KIND_OPTIMIZER = 2
KIND_EXTRA = 3
_KINDS = {"param": KIND_PARAM, "optimizer": KIND_OPTIMIZER}

# Supported element types: torch / numpy dtype name -> safetensors name (types.proto DType).
DTYPES = {
    "float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
    "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_DTYPE_SIZES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
                "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_torch_tensor(value):
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def _is_ndarray(value):
    try:
        import numpy
    except ImportError:
        return False
    return isinstance(value, numpy.ndarray)


def is_tensor(value):
    """True for a torch.Tensor or a numpy.ndarray."""
    return _is_torch_tensor(value) or _is_ndarray(value)


def dtype_name(dtype, where="tensor"):
    """The safetensors name of a torch dtype, numpy dtype or such a name ("F32")."""
    if isinstance(dtype, str) and dtype in _DTYPE_SIZES:
        return dtype
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    try:
        import numpy
        if isinstance(dtype, (numpy.dtype, type)) and not name.startswith("<"):
            name = numpy.dtype(dtype).name
    except (ImportError, TypeError):
        pass
    if name not in DTYPES:
        raise errors.malformed(
            "%s has dtype %s, which Tessera does not store; supported: %s"
            % (where, dtype, ", ".join(sorted(DTYPES))))
    return DTYPES[name]


class TensorInfo:
    """What the native client needs of a tensor: dtype, shape, pointer, size, memory."""

    __slots__ = ("dtype", "shape", "data_ptr", "nbytes", "cuda")

    def __init__(self, dtype, shape, data_ptr, nbytes, cuda):
        self.dtype, self.shape, self.data_ptr, self.nbytes, self.cuda = (
            dtype, shape, data_ptr, nbytes, cuda)

    @property
    def numel(self):
        return math.prod(self.shape)


def _check_plain_tensor(value, where):
    """Refuses a torch.Tensor subclass with a __torch_dispatch__ of its own (torchao's float8
    tensors, anything made with _make_wrapper_subclass, a DTensor): its memory is that of the
    tensors it wraps, its data_ptr() is 0 or storage_offset * itemsize, and a copy from or into
    it would crash the process. Subclasses without one (nn.Parameter and its subclasses,
    Tensor.as_subclass) hold their own storage and pass. DTensors are described from their
    placements before they get here (to_ref); one inside a Shard is refused."""
    torch = _torch()
    if type(value).__torch_dispatch__ is torch.Tensor.__torch_dispatch__:
        return
    raise errors.malformed(
        "%s is a %s.%s, a torch.Tensor subclass that dispatches its own operations: its "
        "data_ptr() need not be its data (a wrapper subclass holds none), and Tessera copies a "
        "tensor's own memory; pass a plain torch.Tensor (e.g. the subclass's inner tensor)%s"
        % (where, type(value).__module__, type(value).__qualname__,
           "; a DTensor goes into the mapping as it is, not into a Shard"
           if dtensors.is_dtensor(value) else ""))


def tensor_info(value, where, for_load=False):
    """Checks a torch tensor or numpy array and returns its TensorInfo.

    Raises InvalidArgumentError (MALFORMED_SHARD) naming `where` for an unsupported dtype,
    device or layout, a non-contiguous tensor, a tensor subclass, or (for_load) a read-only
    array.
    """
    if _is_torch_tensor(value):
        torch = _torch()
        _check_plain_tensor(value, where)
        if value.layout != torch.strided:
            raise errors.malformed("%s has layout %s; only dense (strided) tensors are stored"
                                   % (where, value.layout))
        if value.device.type not in ("cpu", "cuda"):
            raise errors.malformed("%s is on device %s; only CPU and CUDA tensors are supported"
                                   % (where, value.device))
        dtype = dtype_name(value.dtype, where)
        if not value.is_contiguous():
            raise errors.malformed(
                "%s is not contiguous (shape %s, strides %s); Tessera copies raw memory and "
                "never copies implicitly: pass tensor.contiguous() to save it (a load needs "
                "contiguous destination memory)" % (where, tuple(value.shape), value.stride()))
        if value.is_conj() or value.is_neg():
            raise errors.malformed("%s has a lazy conjugate/negative bit; call "
                                   "resolve_conj()/resolve_neg() first" % where)
        shape = tuple(int(d) for d in value.shape)
        return TensorInfo(dtype, shape, int(value.data_ptr()),
                          int(value.numel()) * int(value.element_size()),
                          value.device.type == "cuda")
    if _is_ndarray(value):
        if not value.dtype.isnative:
            raise errors.malformed("%s has non-native byte order %s" % (where, value.dtype))
        dtype = dtype_name(value.dtype, where)
        if not value.flags.c_contiguous:
            raise errors.malformed(
                "%s is not C-contiguous (strides %s); pass numpy.ascontiguousarray(a) to save "
                "it (a load needs contiguous destination memory)" % (where, value.strides))
        if for_load and not value.flags.writeable:
            raise errors.malformed("%s is read-only; a load needs writable memory" % where)
        return TensorInfo(dtype, tuple(int(d) for d in value.shape),
                          int(value.__array_interface__["data"][0]), int(value.nbytes), False)
    raise errors.malformed("%s is a %s; expected a torch.Tensor, numpy.ndarray, tessera.Shard "
                           "or tessera.Absent" % (where, type(value).__name__))


_INT64_MAX = (1 << 63) - 1


def _int_tuple(values, what, allow_negative=False):
    if values is None:
        return None
    if isinstance(values, (str, bytes)):
        raise errors.malformed("%s must be a sequence of ints, not %r" % (what, values))
    try:
        out = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise errors.malformed("%s must be a sequence of ints, not %r" % (what, values)) from None
    if not allow_negative and any(v < 0 for v in out):
        raise errors.malformed("%s must not be negative: %r" % (what, out))
    for i, v in enumerate(out):
        if not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            raise errors.malformed("%s[%d] = %d does not fit in a signed 64-bit integer: %r"
                                   % (what, i, v, out))
    return out


def check_name(name, what, where, fqn=None):
    """Raises MALFORMED_SHARD unless `name` (an fqn or state key) can go on the wire: a str
    that encodes as UTF-8. A str decoded from non-UTF-8 bytes with surrogateescape (as
    os.fsdecode does) holds lone surrogates and cannot; the other rules (length, control
    characters, '#' and '@') are checked by the native client, as the coordinator would."""
    if not isinstance(name, str):
        raise errors.malformed("%s: the %s must be a str, not %r" % (where, what, name),
                               fqn=fqn if isinstance(fqn, str) else None)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise errors.malformed(
            "%s: the %s \"%s\" is not valid UTF-8 (character %d is the lone surrogate %s; was "
            "it decoded from bytes with surrogateescape?); names must be UTF-8 text"
            % (where, what, shown, e.start, ascii(name[e.start])),
            fqn=shown if fqn is None else fqn) from None


def _dims(replicated_over):
    if replicated_over is None:
        return None
    if isinstance(replicated_over, str):
        return (replicated_over,)
    dims = tuple(replicated_over)
    if not all(isinstance(d, str) and d for d in dims):
        raise errors.malformed("replicated_over must name mesh dims (strings), not %r"
                               % (replicated_over,))
    return dims


def _check_box(global_shape, offsets, lengths, where, flat_range=None):
    """The shard rules' box and flat-range checks (common/shard_rules.h, through the native
    module: the coordinator's words, kept in one place). Returns the box's element count."""
    from .client import _call  # the native module comes with the client
    from . import _tessera
    return _call(_tessera.check_box, where, list(global_shape), list(offsets), list(lengths),
                 None if flat_range is None else tuple(flat_range))


class Shard:
    """A piece of a (possibly larger) tensor this rank holds or wants.

    Args:
      tensor: the local memory (torch.Tensor or numpy.ndarray, contiguous).
      global_shape: shape of the whole tensor across the job (``()`` for a 0-d tensor).
      offsets: where this rank's box starts in the global tensor. Default: all zeros.
      flat_range: ``(begin, end)``: the tensor holds only elements [begin, end) of the box
        flattened row-major (a distributed optimizer's slice); it must have end - begin
        elements, of any shape.
      replicated_over: mesh dims along which this piece is a replica; ``"*"`` (ALL_DIMS): all
        of them; ``"*model"`` (MODEL_REPLICA): all but the split dims (pp). Default: see the module docstring (``["dp"]`` if the mesh has dp and there is
        no flat range, else ``[]``).
      kind: ``"param"`` (parameters and buffers) or ``"optimizer"``.
      state_key: optimizer state key ("exp_avg"); for kind="optimizer" it may instead come from
        the mapping key "<fqn>#<state_key>".
      local_shape: shape of the box. Default: the tensor's shape; with a flat range, the global
        shape minus the offsets.

    Raises InvalidArgumentError (MALFORMED_SHARD) at construction for inconsistent metadata.
    """

    __slots__ = ("tensor", "global_shape", "offsets", "local_shape", "flat_range",
                 "replicated_over", "kind", "state_key")

    def __init__(self, tensor, global_shape, offsets=None, flat_range=None, replicated_over=None,
                 kind="param", state_key=None, *, local_shape=None):
        where = "Shard"
        info = tensor_info(tensor, "the Shard's tensor")
        if kind not in _KINDS:
            raise errors.malformed("Shard kind must be 'param' or 'optimizer', not %r" % (kind,))
        if state_key is not None and (not isinstance(state_key, str) or not state_key):
            raise errors.malformed("state_key must be a non-empty string, not %r" % (state_key,))
        if kind == "param" and state_key is not None:
            raise errors.malformed("only kind='optimizer' shards have a state_key (got %r)"
                                   % state_key)
        global_shape = _int_tuple(global_shape, "global_shape")
        if global_shape is None:
            raise errors.malformed("a Shard needs its global_shape")
        offsets = _int_tuple(offsets, "offsets") or (0,) * len(global_shape)
        if flat_range is not None:
            flat_range = _int_tuple(flat_range, "flat_range", allow_negative=True)
            if len(flat_range) != 2:
                raise errors.malformed("flat_range must be (begin, end), not %r" % (flat_range,))
        if local_shape is None:
            if flat_range is None:
                local_shape = info.shape
            elif len(offsets) == len(global_shape):
                local_shape = tuple(g - o for g, o in zip(global_shape, offsets))
            else:
                local_shape = global_shape
        local_shape = _int_tuple(local_shape, "local_shape")
        _check_box(global_shape, offsets, local_shape, where, flat_range)
        if flat_range is None:
            if info.shape != local_shape:
                raise errors.malformed("Shard: the tensor's shape %s differs from the box shape %s"
                                       % (info.shape, local_shape))
        elif info.numel != flat_range[1] - flat_range[0]:
            raise errors.malformed("Shard: flat_range %s holds %d elements but the tensor has %d"
                                   % (flat_range, flat_range[1] - flat_range[0], info.numel))
        self.tensor = tensor
        self.global_shape = global_shape
        self.offsets = offsets
        self.local_shape = local_shape
        self.flat_range = flat_range
        self.replicated_over = _dims(replicated_over)
        self.kind = kind
        self.state_key = state_key

    def __repr__(self):
        return ("Shard(%s, global_shape=%s, offsets=%s, local_shape=%s, flat_range=%s, "
                "replicated_over=%s, kind=%r, state_key=%r)" % (
                    type(self.tensor).__name__, self.global_shape, self.offsets, self.local_shape,
                    self.flat_range, self.replicated_over, self.kind, self.state_key))


class Absent:
    """Marks a parameter whose optimizer state does not exist yet on this rank (before the
    first optimizer step, or a parameter that never had a gradient). Saved as an explicit
    "absent" declaration (types.proto ShardDesc.state_absent) so every DP rank can agree on it;
    never a KeyError. Save only: a load cannot fill state that does not exist — materialise
    it first (tessera.init_optimizer_state), or, for a frozen parameter (requires_grad=False,
    which gets no state), leave its ``"<fqn>#"`` entry out of the load's mapping.

    Args: the parameter's global_shape and dtype (torch/numpy dtype or "F32"), and its box
    (offsets, local_shape; default: the whole tensor) and replicated_over as for Shard.
    """

    __slots__ = ("global_shape", "dtype", "offsets", "local_shape", "replicated_over", "dtensor")

    def __init__(self, global_shape, dtype, offsets=None, local_shape=None, replicated_over=None):
        # A parameter given as a DTensor (Absent.like): its box and replicas are resolved
        # against the job's layout when the mapping is described (to_ref).
        self.dtensor = None
        self.global_shape = _int_tuple(global_shape, "global_shape")
        if self.global_shape is None:
            raise errors.malformed("Absent needs the parameter's global_shape")
        self.dtype = dtype_name(dtype, "Absent")
        self.offsets = _int_tuple(offsets, "offsets") or (0,) * len(self.global_shape)
        self.local_shape = _int_tuple(local_shape, "local_shape") or tuple(
            g - o for g, o in zip(self.global_shape, self.offsets))
        _check_box(self.global_shape, self.offsets, self.local_shape, "Absent")
        self.replicated_over = _dims(replicated_over)

    @classmethod
    def like(cls, param):
        """The Absent marker for a parameter given as a tensor, a DTensor or a Shard."""
        if dtensors.is_dtensor(param):
            marker = cls(tuple(param.shape), param.dtype)
            marker.dtensor = param
            return marker
        if isinstance(param, Shard):
            info = tensor_info(param.tensor, "the parameter")
            return cls(param.global_shape, info.dtype, param.offsets, param.local_shape,
                       param.replicated_over)
        info = tensor_info(param, "the parameter")
        return cls(info.shape, info.dtype)

    def __repr__(self):
        return "Absent(global_shape=%s, dtype=%s, offsets=%s, local_shape=%s)" % (
            self.global_shape, self.dtype, self.offsets, self.local_shape)


def split_key(key):
    """("fqn", "state_key" or None) of a mapping key "fqn" or "fqn#state_key"."""
    if not isinstance(key, str):
        raise errors.malformed("tensor keys must be strings, not %r" % (key,))
    fqn, sep, state_key = key.partition("#")
    if "#" in state_key:
        raise errors.malformed("key %r has more than one '#'" % key, fqn=key)
    return fqn, (state_key if sep else None)


def _default_replication(layout, flat_range):
    return ["dp"] if "dp" in layout.dims and flat_range is None else []


def _replication(replicated, layout, flat_range):
    if replicated is None:
        return _default_replication(layout, flat_range)
    if tuple(replicated) == (ALL_DIMS,):
        return list(layout.dims)
    if tuple(replicated) == (MODEL_REPLICA,):
        return layout.replica_dims(())
    return list(replicated)


def _from_dtensor(value, optimizer, where, layout, for_load):
    """The Shard of a DTensor on this rank (tessera.dtensor's rules)."""
    d = dtensors.describe(value, where, layout)
    tensor_info(d.local, where, for_load)  # a refusal names the key, not "the Shard's tensor"
    return Shard(d.local, d.global_shape, offsets=d.offsets, replicated_over=d.replicated_over,
                 kind="optimizer" if optimizer else "param", local_shape=d.local_shape)


def to_ref(key, value, layout, for_load=False):
    """The native client's 13-tuple (tessera_module.cc) for one mapping entry.

    `layout` is the job's tessera.layout.JobLayout (or a sequence of its dim names, which
    is enough for anything but DTensors). Returns (ref, tensor) where tensor is what must
    stay alive for the call. Raises InvalidArgumentError (MALFORMED_SHARD) naming `key`.
    """
    layout = JobLayout.of(layout)
    fqn, key_state = split_key(key)
    where = "tensor %s" % ascii(key)
    check_name(fqn, "fqn", where)
    if dtensors.is_dtensor(value):
        value = _from_dtensor(value, key_state is not None, where, layout, for_load)
    if isinstance(value, Absent):
        if for_load:
            # Not skipped: the checkpoint may hold state for it, which a load must not drop
            # silently (a forgotten init_optimizer_state would drop all of it).
            raise errors.malformed(
                "%s is tessera.Absent: there is no optimizer state here to load into. "
                "tessera.init_optimizer_state(optimizer), called before flatten_state, creates "
                "the state of every trainable parameter; a parameter with requires_grad=False "
                "gets none, and its %r entry must be left out of the load's `into` (del "
                "state[%r])" % (where, key, key), fqn=fqn)
        if key_state:
            raise errors.malformed("%s: an Absent marker goes under the key %r or %r, without a "
                                   "state key" % (where, fqn, fqn + "#"), fqn=fqn)
        if value.dtensor is not None:
            d = dtensors.describe(value.dtensor, where, layout)
            offsets, local_shape, replicated = d.offsets, d.local_shape, d.replicated_over
        else:
            offsets, local_shape = value.offsets, value.local_shape
            replicated = _replication(value.replicated_over, layout, None)
        ref = (fqn, KIND_OPTIMIZER, value.dtype, list(value.global_shape), list(offsets),
               list(local_shape), None, replicated, "", True, 0, 0, False)
        return ref, None
    if isinstance(value, Shard):
        kind = _KINDS[value.kind]
        state_key = value.state_key
        if key_state is not None:
            if value.kind != "optimizer":
                raise errors.malformed("%s: a key with '#' names optimizer state, but the Shard "
                                       "has kind=%r" % (where, value.kind), fqn=fqn)
            if state_key is not None and state_key != key_state:
                raise errors.malformed("%s: the key says state %r but the Shard says %r"
                                       % (where, key_state, state_key), fqn=fqn)
            state_key = key_state
        if kind == KIND_OPTIMIZER and not state_key:
            raise errors.malformed("%s: optimizer state needs a state_key (Shard(state_key=...) "
                                   "or the key '<fqn>#<state_key>')" % where, fqn=fqn)
        if state_key:
            check_name(state_key, "state_key", where, fqn=fqn)
        info = tensor_info(value.tensor, where, for_load)
        replicated = _replication(value.replicated_over, layout, value.flat_range)
        ref = (fqn, kind, info.dtype, list(value.global_shape), list(value.offsets),
               list(value.local_shape), value.flat_range, replicated, state_key or "",
               False, info.data_ptr, info.nbytes, info.cuda)
        return ref, value.tensor
    if key_state == "":
        raise errors.malformed("%s: the key ends in '#' but the value is not tessera.Absent"
                               % where, fqn=fqn)
    if key_state:
        check_name(key_state, "state_key", where, fqn=fqn)
    info = tensor_info(value, where, for_load)
    kind = KIND_OPTIMIZER if key_state else KIND_PARAM
    ref = (fqn, kind, info.dtype, list(info.shape), None, None, None,
           _default_replication(layout, None), key_state or "", False, info.data_ptr,
           info.nbytes, info.cuda)
    return ref, value
