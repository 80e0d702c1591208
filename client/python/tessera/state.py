"""From PyTorch model and optimizer state to the mapping Client.save / Client.load take.

Three forms of state are accepted, as trainers hold them:

* ``model.state_dict()`` and the ``torch.optim.Optimizer`` (or its ``state_dict()``, whose
  state is keyed by integer param ids);
* the state dicts of ``torch.distributed.checkpoint.state_dict`` —
  ``get_model_state_dict(model)`` and ``get_optimizer_state_dict(model, optimizer)`` (state
  keyed by fqn, ``param_groups[i]["params"]`` lists of fqns) — of a model sharded with
  ``fully_shard`` and/or ``parallelize_module``: DTensors, described from their placements
  (tessera.dtensor); no boxes written by hand;
* either of them with tessera.Shard values for pieces described explicitly.

A state dict that holds DTensors is a model-parallel one: its plain tensors (buffers, the
step counts of the optimizer) are then replicas over every dim of the job's layout but the
split dims (MODEL_REPLICA; hash-checked when saved).
"""

import numbers

from . import dtensor as dtensors
from . import errors
from .shards import ALL_DIMS, MODEL_REPLICA, Absent, Shard, is_tensor

__all__ = ["flatten_state", "init_optimizer_state"]


def _torch():
    import torch
    return torch


def _local(t):
    """The local tensor of a DTensor; any other tensor itself."""
    if dtensors.is_dtensor(t):
        with _torch().no_grad():
            return t.to_local()
    return t


def _same_memory(a, b):
    """True if tensors a and b view the same memory the same way."""
    a, b = _local(a), _local(b)
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.device == b.device)


def _tensor_of(value):
    return value.tensor if isinstance(value, Shard) else value


def _param_fqns(model_state_dict, optimizer, param_names, num_params):
    """fqn of each optimizer param id (0..num_params-1, the order of optimizer.state_dict())."""
    torch = _torch()
    if param_names is not None:
        if isinstance(param_names, torch.nn.Module):
            if optimizer is None or not isinstance(optimizer, torch.optim.Optimizer):
                raise errors.malformed("param_names=<module> needs the optimizer object (not its "
                                       "state_dict) to match parameters by identity")
            by_id = {id(p): name for name, p in param_names.named_parameters()}
            names = []
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) not in by_id:
                        raise errors.malformed("an optimizer parameter of shape %s is not a "
                                               "parameter of the given module" % (tuple(p.shape),))
                    names.append(by_id[id(p)])
        elif isinstance(param_names, dict):
            names = [param_names.get(i) for i in range(num_params)]
            missing = [i for i, n in enumerate(names) if n is None]
            if missing:
                raise errors.malformed("param_names has no fqn for optimizer param ids %s"
                                       % missing)
        else:
            names = list(param_names)
        if len(names) != num_params:
            raise errors.malformed("param_names has %d names but the optimizer has %d parameters"
                                   % (len(names), num_params))
        return names
    if optimizer is None or not isinstance(optimizer, torch.optim.Optimizer):
        raise errors.malformed("flatten_state got an optimizer state_dict: pass param_names (the "
                               "fqn of each optimizer param id, or the model) to name its state")
    # Match each optimizer parameter to the model state_dict entry viewing the same memory
    # (state_dict() tensors are detached views of the parameters). The first key wins for tied
    # weights, as in named_parameters().
    # Empty tensors all have data pointer 0 (an FSDP2 rank past the last chunk of a small
    # parameter holds one): an entry already matched is skipped, so same-shaped empty
    # parameters are named in order rather than all after the first.
    entries = [(k, _tensor_of(v)) for k, v in model_state_dict.items()]
    names = []
    used = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            match = next((k for k, t in entries if k not in used
                          and isinstance(t, torch.Tensor) and _same_memory(t, p)), None)
            used.add(match)
            if match is None:
                raise errors.malformed(
                    "an optimizer parameter of shape %s has no entry in the model state_dict "
                    "sharing its memory; pass param_names=model (or a list of fqns in "
                    "optimizer order)" % (tuple(p.shape),))
            names.append(match)
    return names


def _scalar_replication(param):
    """replicated_over of a sharded parameter's scalar state (AdamW's step): the same on every
    rank holding a piece of the parameter."""
    if dtensors.is_dtensor(param) or (isinstance(param, Shard)
                                      and param.replicated_over == (MODEL_REPLICA,)):
        return MODEL_REPLICA
    return ALL_DIMS


def _state_shard(key, value, param):
    """The mapping value for optimizer state `key` (a tensor) of parameter `param`."""
    if dtensors.is_dtensor(value):
        return value  # described from its own placements
    if dtensors.is_dtensor(param):
        # Not a DTensor next to a DTensor parameter: a scalar (step) or a per-parameter value
        # every rank of the stage holds alike.
        return Shard(value, tuple(value.shape), replicated_over=MODEL_REPLICA,
                     kind="optimizer", state_key=key)
    if isinstance(param, Shard):
        t = value
        if tuple(t.shape) == tuple(param.local_shape) and param.flat_range is None:
            # State shaped like the parameter's piece lies in the parameter's box.
            return Shard(t, param.global_shape, param.offsets, replicated_over=param.replicated_over,
                         kind="optimizer", state_key=key, local_shape=param.local_shape)
        if param.flat_range is not None and t.numel() == param.flat_range[1] - param.flat_range[0]:
            return Shard(t, param.global_shape, param.offsets, flat_range=param.flat_range,
                         replicated_over=param.replicated_over, kind="optimizer", state_key=key,
                         local_shape=param.local_shape)
        # A scalar ("step") is the same on every rank holding a piece of the parameter, which
        # may be sharded over any dim (FSDP, TP): a replica over the whole mesh. Anything else
        # is replicated like the parameter.
        replicated = _scalar_replication(param) if t.dim() == 0 else param.replicated_over
        return Shard(t, tuple(t.shape), replicated_over=replicated, kind="optimizer",
                     state_key=key)
    return value


def _optimizer_state(optimizer, model_state_dict, param_names):
    """[(fqn, state dict or None, write_back(key, number), forget())] in the optimizer's
    parameter order, from an Optimizer, its state_dict() or a get_optimizer_state_dict() dict.
    forget() drops the parameter's state where it was found: from the optimizer's state, or
    from the state dict's "state" (load_state_dict, or set_optimizer_state_dict with
    StateDictOptions(strict=False), then leave the parameter without state); it returns
    has_state(), which says whether state is there again (an optimizer step since)."""
    torch = _torch()
    is_optimizer = isinstance(optimizer, torch.optim.Optimizer)
    osd = optimizer.state_dict() if is_optimizer else optimizer
    if not isinstance(osd, dict) or "state" not in osd or "param_groups" not in osd:
        raise errors.malformed("optimizer must be a torch.optim.Optimizer, its state_dict() or "
                               "get_optimizer_state_dict(model, optimizer)")
    ids = [i for group in osd["param_groups"] for i in group["params"]]
    if ids and all(isinstance(i, str) for i in ids):
        # get_optimizer_state_dict(): state and param_groups name parameters by fqn.
        if len(set(ids)) != len(ids):
            raise errors.malformed("the optimizer state_dict lists a parameter twice in its "
                                   "param_groups")
        state = osd["state"]

        def setter(fqn):
            def write(key, number):
                state[fqn][key] = number
            return write

        def forgetter(fqn):
            def forget():
                state.pop(fqn, None)
                return lambda: bool(state.get(fqn))
            return forget
        return [(fqn, state.get(fqn), setter(fqn), forgetter(fqn)) for fqn in ids]
    if sorted(ids) != list(range(len(ids))):
        raise errors.malformed("the optimizer state_dict's param ids %s are neither 0..%d nor "
                               "fqns" % (ids, len(ids) - 1))
    names = _param_fqns(model_state_dict, optimizer if is_optimizer else None, param_names,
                        len(ids))
    live_params = ([p for g in optimizer.param_groups for p in g["params"]] if is_optimizer
                   else [None] * len(ids))
    out = []
    for pid in range(len(ids)):
        def write(key, number, pid=pid, param=live_params[pid]):
            if param is not None:
                optimizer.state[param][key] = number
            else:
                osd["state"][pid][key] = number

        def forget(pid=pid, param=live_params[pid]):
            if param is not None:
                optimizer.state.pop(param, None)
                return lambda: bool(optimizer.state.get(param))
            osd["state"].pop(pid, None)
            return lambda: bool(osd["state"].get(pid))
        out.append((names[pid], osd["state"].get(pid), write, forget))
    return out


class FlatState(dict):
    """What flatten_state returns: a dict key -> tensor / Shard / Absent (use it as one) that
    also remembers where each parameter's optimizer state came from, so that a load into it
    can drop the state of a parameter the checkpoint saved without any (forget_absent_state).
    A plain dict made from it (dict(state), a comprehension) forgets that: to leave entries
    out of a load, delete them from it (``del state[key]``). After a load dropped a
    parameter's state, the mapping marks it Absent; once the optimizer has state for it again
    (a step), a save of the mapping is refused — build it again with flatten_state."""

    def __init__(self):
        super().__init__()
        self._stateful = {}  # fqn -> (parameter value, forget()) of each parameter with state
        self._forgotten = {}  # fqn -> has_state() of each parameter whose state a load dropped

    def _remember(self, fqn, param, forget):
        self._stateful[fqn] = (param, forget)

    def _forget_absent(self, absent_keys):
        absent = set(absent_keys)
        loaded = {}  # fqn -> its optimizer-state keys here
        for key in self:
            if isinstance(key, str):
                fqn, _, state_key = key.partition("#")
                if state_key and fqn in self._stateful:
                    loaded.setdefault(fqn, []).append(key)
        for fqn, keys in loaded.items():
            if all(k in absent for k in keys):
                param, forget = self._stateful.pop(fqn)
                self._forgotten[fqn] = forget()
                for k in keys:
                    del self[k]
                self[fqn + "#"] = Absent.like(param)


    def _check_current(self):
        for fqn, has_state in self._forgotten.items():
            if has_state():
                raise errors.malformed(
                    "this tessera.flatten_state mapping marks the optimizer state of %r absent "
                    "(a load found it saved without any), but the optimizer has state for it "
                    "now (a step since): build the mapping again with tessera.flatten_state "
                    "before saving" % (fqn,), fqn=fqn)


def check_current(tensors):
    """Before a save of `tensors`: refuses a flatten_state mapping that a load left stale (a
    parameter it marks Absent has optimizer state again). Any other mapping: nothing."""
    if isinstance(tensors, FlatState):
        tensors._check_current()


def flatten_state(model_state_dict, optimizer=None, *, param_names=None):
    """The tensors of a model (and optimizer) as the mapping Client.save / Client.load take.

    Args:
      model_state_dict: ``model.state_dict()`` or ``get_model_state_dict(model)`` (values:
        tensors, DTensors, or tessera.Shard for pieces described by hand). Entries become
        parameters under their own key. If it holds DTensors, its plain tensors are replicas
        over the layout's dims but the split dims (MODEL_REPLICA).
      optimizer: a ``torch.optim.Optimizer``, its ``state_dict()``, or
        ``get_optimizer_state_dict(model, optimizer)``. The state of parameter ``<fqn>``
        becomes ``"<fqn>#<state_key>"`` entries (kind=optimizer, e.g. ``"w#exp_avg"``,
        ``"w#step"``; 0-d tensors such as AdamW's step are fine). A parameter with no state
        yet (before the first step) becomes ``"<fqn>#": tessera.Absent``. State that is a
        DTensor is described from its placements; state shaped like a Shard parameter's piece
        inherits its Shard metadata; a sharded parameter's scalar state (step) is a replica
        over every rank holding a piece of it (ALL_DIMS for a Shard, MODEL_REPLICA for a
        DTensor). Python-number state is saved as a 0-d tensor (and written back after a load,
        into the optimizer or the optimizer state dict given); None values are skipped.
      param_names: for an integer-keyed optimizer state: how to name the param ids — a list
        of fqns in the optimizer's parameter order, a dict {id: fqn}, or the ``nn.Module``
        (matched by identity). Default: match each optimizer parameter to the model
        state_dict entry that shares its memory (needs the optimizer object).

    Returns a dict (a FlatState) whose tensors alias the live model/optimizer memory (a
    DTensor's local tensor), so a load into it restores the model and optimizer in place.
    After a load into it (Client.load), a parameter whose state the checkpoint records as
    absent (saved before its first step, or frozen then) has its state dropped — the state
    tessera.init_optimizer_state made up for it (step=1, zero moments) would otherwise skew
    its first update — from the optimizer (``optimizer.state.pop(param)``) or from the
    optimizer state dict's "state" (so ``load_state_dict`` leaves it without state;
    ``set_optimizer_state_dict`` does with ``options=StateDictOptions(strict=False)``, and
    with strict=True refuses the missing state), and its entries here become its
    ``"<fqn>#"`` Absent marker — until the optimizer has state for it again (a step): a save
    of the mapping is then refused; build it again. To leave entries out of a load, delete
    them from the returned mapping (``del state[key]``): a plain dict copy loads the same
    tensors but drops no state.

    Raises InvalidArgumentError (MALFORMED_SHARD) for a non-tensor state_dict entry or a
    parameter it cannot name.
    """
    flat = FlatState()
    model_parallel = any(dtensors.is_dtensor(v) for v in model_state_dict.values())
    for key, value in model_state_dict.items():
        if "#" in key:
            raise errors.malformed("state_dict key %r contains '#', which Tessera reserves" % key,
                                   fqn=key)
        if not (is_tensor(value) or isinstance(value, Shard)):
            raise errors.malformed(
                "state_dict entry %r is a %s, not a tensor; save it through objects= instead"
                % (key, type(value).__name__), fqn=key)
        if model_parallel and not dtensors.is_dtensor(value) and not isinstance(value, Shard):
            value = Shard(value, tuple(value.shape), replicated_over=MODEL_REPLICA)
        flat[key] = value
    if optimizer is None:
        return flat

    for fqn, state, write_back, forget in _optimizer_state(optimizer, model_state_dict,
                                                          param_names):
        if fqn not in flat:
            raise errors.malformed("optimizer parameter %r is not in the model state_dict"
                                   % (fqn,), fqn=fqn if isinstance(fqn, str) else None)
        param = flat[fqn]
        if not state:
            flat[fqn + "#"] = Absent.like(param)
            continue
        flat._remember(fqn, param, forget)
        for key in sorted(state):
            value = state[key]
            if value is None:
                continue
            if not isinstance(key, str) or not key or "#" in key or "@" in key:
                raise errors.malformed("optimizer state key %r of %r is not usable" % (key, fqn),
                                       fqn=fqn)
            if isinstance(value, numbers.Number):
                replicated = (_scalar_replication(param)
                              if isinstance(param, Shard) or dtensors.is_dtensor(param) else None)
                flat[fqn + "#" + key] = _NumberShard(value, write_back, key, replicated)
            elif is_tensor(value):
                flat[fqn + "#" + key] = _state_shard(key, value, param)
            else:
                raise errors.malformed("optimizer state %r of %r is a %s; only tensors and "
                                       "numbers are stored" % (key, fqn, type(value).__name__),
                                       fqn=fqn, state_key=key)
    return flat


class _NumberShard(Shard):
    """A Python-number optimizer state value, staged as a 0-d tensor. After a load,
    write_back() stores the loaded number where flatten_state found it (the optimizer's state,
    or the optimizer state dict given)."""

    __slots__ = ("_number_type", "_write")

    def __init__(self, value, write, key, replicated_over):
        torch = _torch()
        dtype = (torch.bool if isinstance(value, bool) else
                 torch.int64 if isinstance(value, numbers.Integral) else torch.float64)
        super().__init__(torch.tensor(value, dtype=dtype), (), replicated_over=replicated_over,
                         kind="optimizer", state_key=key)
        self._number_type = type(value)
        self._write = write

    def write_back(self):
        self._write(self.state_key, self._number_type(self.tensor.item()))


def write_back_numbers(into):
    """After a load into a flatten_state mapping, stores loaded Python-number state."""
    for value in into.values():
        if isinstance(value, _NumberShard):
            value.write_back()


def forget_absent_state(into, absent_keys):
    """After a load into a flatten_state mapping (a FlatState; any other mapping: nothing),
    given the keys of `into` the load reported absent: drops the optimizer state of every
    parameter all of whose optimizer-state keys in `into` came back absent (the checkpoint
    saved it without state), where flatten_state found it, and replaces those keys in `into`
    with the parameter's ``"<fqn>#"`` Absent marker. Call it after write_back_numbers."""
    if isinstance(into, FlatState):
        into._forget_absent(absent_keys)


def init_optimizer_state(optimizer):
    """Materialises the lazily created state of every trainable parameter (requires_grad)
    that has none, without changing the parameters or existing state, so that a load has
    tensors to fill: call it on a fresh optimizer before flatten_state + Client.load. Frozen
    parameters (requires_grad=False) stay without state, as they were when training saved
    them: their ``"<fqn>#"`` entries remain tessera.Absent, which a load refuses — delete them
    from flatten_state's mapping before the load (``del state[fqn + "#"]``).

    Runs one optimizer.step() in which only the stateless parameters have a (zero) gradient
    and every group's learning rate is 0 (AdamW's decoupled weight decay is scaled by the
    learning rate, so it is a no-op too); then restores the learning rates and gradients. The
    state it creates (e.g. step=1, zero moments) is meant to be overwritten by the load; that
    of a parameter the checkpoint saved without state is dropped by a load into the mapping
    flatten_state returned (not into a copy of it), so its first real step starts from none.
    """
    torch = _torch()
    saved = []  # (group, lr) and (param, grad) to restore
    grads = [(p, p.grad) for g in optimizer.param_groups for p in g["params"]]
    try:
        for group in optimizer.param_groups:
            if "lr" in group:
                saved.append((group, group["lr"]))
                group["lr"] = (torch.zeros_like(group["lr"]) if torch.is_tensor(group["lr"])
                               else 0.0)
        missing = 0
        for p, _ in grads:
            # Parameters that have state sit this step out (no gradient: skipped).
            if optimizer.state.get(p) or not p.requires_grad:
                p.grad = None
            else:
                p.grad = torch.zeros_like(p)
                missing += 1
        if missing:
            optimizer.step()
    finally:
        for group, lr in saved:
            group["lr"] = lr
        for p, grad in grads:
            p.grad = grad
