"""From PyTorch model and optimizer state to the mapping Client.save / Client.load take."""

import numbers

from . import errors
from .shards import ALL_DIMS, Absent, Shard, is_tensor

__all__ = ["flatten_state", "init_optimizer_state"]


def _torch():
    import torch
    return torch


def _same_memory(a, b):
    """True if tensors a and b view the same memory the same way."""
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


def _state_shard(key, value, param):
    """The mapping value for optimizer state `key` of parameter `fqn`."""
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
        replicated = ALL_DIMS if t.dim() == 0 else param.replicated_over
        return Shard(t, tuple(t.shape), replicated_over=replicated, kind="optimizer",
                     state_key=key)
    return value


def flatten_state(model_state_dict, optimizer=None, *, param_names=None):
    """The tensors of a model (and optimizer) as the mapping Client.save / Client.load take.

    Args:
      model_state_dict: ``model.state_dict()`` (values: tensors, or tessera.Shard for sharded
        parameters). Entries become parameters under their own key.
      optimizer: a ``torch.optim.Optimizer`` or its ``state_dict()``. The state of parameter
        ``<fqn>`` becomes ``"<fqn>#<state_key>"`` entries (kind=optimizer, e.g.
        ``"w#exp_avg"``, ``"w#step"``; 0-d tensors such as AdamW's step are fine). A parameter
        with no state yet (before the first step) becomes ``"<fqn>#": tessera.Absent``. State
        shaped like a sharded parameter's piece inherits its Shard metadata; a sharded
        parameter's scalar state (step) is a replica over the whole mesh (ALL_DIMS).
        Python-number state is saved as a 0-d tensor (and written back after a load); None
        values are skipped.
      param_names: how to name the optimizer's integer param ids: a list of fqns in the
        optimizer's parameter order, a dict {id: fqn}, or the ``nn.Module`` (matched by
        identity). Default: match each optimizer parameter to the model state_dict entry that
        shares its memory (needs the optimizer object).

    Returned tensors alias the live model/optimizer memory, so a load into the mapping
    restores the model and optimizer in place.

    Raises InvalidArgumentError (MALFORMED_SHARD) for a non-tensor state_dict entry or a
    parameter it cannot name.
    """
    torch = _torch()
    flat = {}
    for key, value in model_state_dict.items():
        if "#" in key:
            raise errors.malformed("state_dict key %r contains '#', which Tessera reserves" % key,
                                   fqn=key)
        if not (is_tensor(value) or isinstance(value, Shard)):
            raise errors.malformed(
                "state_dict entry %r is a %s, not a tensor; save it through objects= instead"
                % (key, type(value).__name__), fqn=key)
        flat[key] = value
    if optimizer is None:
        return flat

    is_optimizer = isinstance(optimizer, torch.optim.Optimizer)
    osd = optimizer.state_dict() if is_optimizer else optimizer
    if not isinstance(osd, dict) or "state" not in osd or "param_groups" not in osd:
        raise errors.malformed("optimizer must be a torch.optim.Optimizer or its state_dict()")
    ids = [i for group in osd["param_groups"] for i in group["params"]]
    if sorted(ids) != list(range(len(ids))):
        raise errors.malformed("the optimizer state_dict's param ids %s are not 0..%d"
                               % (ids, len(ids) - 1))
    names = _param_fqns(model_state_dict, optimizer if is_optimizer else None, param_names,
                        len(ids))
    live_params = ([p for g in optimizer.param_groups for p in g["params"]] if is_optimizer
                   else [None] * len(ids))
    for pid in range(len(ids)):
        fqn = names[pid]
        if fqn not in flat:
            raise errors.malformed("optimizer parameter %d is named %r, which is not in the model "
                                   "state_dict" % (pid, fqn), fqn=fqn)
        param = flat[fqn]
        state = osd["state"].get(pid)
        if not state:
            flat[fqn + "#"] = Absent.like(param)
            continue
        for key in sorted(state):
            value = state[key]
            if value is None:
                continue
            if not isinstance(key, str) or not key or "#" in key or "@" in key:
                raise errors.malformed("optimizer state key %r of %r is not usable" % (key, fqn),
                                       fqn=fqn)
            if isinstance(value, numbers.Number):
                replicated = ALL_DIMS if isinstance(param, Shard) else None
                flat[fqn + "#" + key] = _NumberShard(value, optimizer if is_optimizer else None,
                                                     live_params[pid], key, replicated)
            elif is_tensor(value):
                flat[fqn + "#" + key] = _state_shard(key, value, param)
            else:
                raise errors.malformed("optimizer state %r of %r is a %s; only tensors and "
                                       "numbers are stored" % (key, fqn, type(value).__name__),
                                       fqn=fqn, state_key=key)
    return flat


class _NumberShard(Shard):
    """A Python-number optimizer state value, staged as a 0-d tensor. After a load,
    write_back() stores the loaded number into the optimizer's state (when flatten_state had
    the optimizer object)."""

    __slots__ = ("_number_type", "_optimizer", "_param")

    def __init__(self, value, optimizer, param, key, replicated_over):
        torch = _torch()
        dtype = (torch.bool if isinstance(value, bool) else
                 torch.int64 if isinstance(value, numbers.Integral) else torch.float64)
        super().__init__(torch.tensor(value, dtype=dtype), (), replicated_over=replicated_over,
                         kind="optimizer", state_key=key)
        self._number_type = type(value)
        self._optimizer = optimizer
        self._param = param

    def write_back(self):
        if self._optimizer is not None:
            self._optimizer.state[self._param][self.state_key] = self._number_type(
                self.tensor.item())


def write_back_numbers(into):
    """After a load into a flatten_state mapping, stores loaded Python-number state."""
    for value in into.values():
        if isinstance(value, _NumberShard):
            value.write_back()


def init_optimizer_state(optimizer):
    """Materialises the lazily created state of every trainable parameter (requires_grad)
    that has none, without changing the parameters or existing state, so that a load has
    tensors to fill: call it on a fresh optimizer before flatten_state + Client.load. Frozen
    parameters stay without state (their entries remain tessera.Absent; leave those out of a
    load's `into`), as they were when training saved them.

    Runs one optimizer.step() in which only the stateless parameters have a (zero) gradient
    and every group's learning rate is 0 (AdamW's decoupled weight decay is scaled by the
    learning rate, so it is a no-op too); then restores the learning rates and gradients. The
    state it creates (e.g. step=1, zero moments) is meant to be overwritten by the load.
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
