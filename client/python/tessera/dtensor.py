"""DTensors as Tessera pieces: FSDP2 (``fully_shard``), tensor parallelism
(``parallelize_module``) and any DTensor built with ``distribute_tensor`` are described from
their placements — no hand-written boxes::

    model_sd = get_model_state_dict(model)                     # DTensors
    optim_sd = get_optimizer_state_dict(model, optimizer)      # DTensors + step scalars
    client.save(step, tessera.flatten_state(model_sd, optim_sd))

Rules (each violation: InvalidArgumentError, MALFORMED_SHARD, naming the tensor):

1. **Mesh dims map to the job's layout dims** (the agents' ``--layout``; tessera.layout): a
   named DeviceMesh dim maps to the layout dim of the same name unless
   ``Client(mesh_dims={name: layout dim})`` says otherwise; a tuple of layout dims stands for a
   flattened mesh dim (torchtitan's ``"dp_shard_cp"`` = ``("dp_shard", "cp")``, row-major).
   The only dim of an unnamed 1-D mesh (``fully_shard(model)`` without a mesh) maps to the
   layout's only dim. A mesh dim that maps to nothing is refused.
2. **Coordinates agree**: on every mesh dim, this rank's DeviceMesh coordinate equals its
   agent's layout coordinate (flattened for a tuple) and the mesh dim's size equals the
   degree. Otherwise the agents were started with another rank order or dim order than the
   mesh, and boxes and replica groups would not match: refused.
3. **The box** is the piece torch's placements give this rank: ``Shard(d)`` cuts dim d as
   ``torch.chunk`` does (uneven; empty past the last chunk, at offset = the dim's size, as
   torch reports it), ``_StridedShard(d, split_factor)`` (FSDP2 over a TP shard of the same
   dim) as torch's ``_StridedShard._split_tensor`` does; several mesh dims sharding one
   tensor dim apply left to right. The rows a rank holds must be one contiguous run, the
   local tensor must have the box's shape, and the offset must be what torch's
   ``compute_local_shape_and_global_offset`` (which DCP uses) says; a placement for which any
   of this fails is refused rather than guessed.
4. **replicated_over** is every layout dim the placements do not shard along: mesh dims with
   ``Replicate()``, and layout dims outside the tensor's mesh (under FSDP x TP a norm weight
   lives on the dp_shard submesh and every tp rank holds it) — except the layout's *split
   dims* (``Client(split_dims=...)``, default ``("pp",)``): pipeline stages hold different
   layers, so two stages naming a layer alike is DUPLICATE_FQN, never a replica. A tensor
   the stages truly share (a tied embedding, a rotary-frequency buffer every stage keeps) is
   declared so by the trainer: ``tessera.Shard(t, shape, replicated_over="*")`` in place of
   its entry. Declared replicas are compared by hash when saved (REPLICA_DIVERGED), never
   trusted.
5. ``Partial()`` (a reduction not yet done) and placements this module does not know are
   refused.

The local tensor (``to_local()``) is staged for a save and written in place by a load, so a
load into the DTensors of ``get_model_state_dict`` / ``get_optimizer_state_dict`` fills the
live sharded parameters and optimizer state, on whatever mesh the loading job has.
"""

import sys

from . import errors
from .layout import JobLayout

__all__ = ["is_dtensor", "describe"]


def _dtensor_type():
    """The DTensor class if its module is loaded, else None. A DTensor exists only once
    torch.distributed.tensor was imported; importing it here instead would add about a second
    to the first save or load of every process that never uses DTensors."""
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "DTensor"):
            return module.DTensor
    return None


def is_dtensor(value):
    t = _dtensor_type()
    return t is not None and isinstance(value, t)


class Described:
    """What a DTensor is to Tessera: the local tensor, the global shape, the box and the
    layout dims it is a replica over."""

    __slots__ = ("local", "global_shape", "offsets", "local_shape", "replicated_over")

    def __init__(self, local, global_shape, offsets, local_shape, replicated_over):
        self.local, self.global_shape = local, global_shape
        self.offsets, self.local_shape = offsets, local_shape
        self.replicated_over = replicated_over


def _chunk(seq, parts):
    """torch.chunk(seq, parts) padded with empty pieces to `parts` entries (what torch's
    Shard and _StridedShard placements do with an uneven dim)."""
    size = -(-len(seq) // parts)
    if size == 0:
        return [seq[:0]] * parts
    return [seq[i * size:(i + 1) * size] for i in range(parts)]


def _indices(size, cuts):
    """The global indices of one tensor dim this rank holds after `cuts`, a list of
    (mesh dim size, coordinate, split_factor or None) applied left to right."""
    idx = list(range(size))
    for parts, coord, split_factor in cuts:
        if split_factor is None:
            idx = _chunk(idx, parts)[coord]
        else:
            groups = [_chunk(g, parts) for g in _chunk(idx, split_factor)]
            idx = [i for g in groups for i in g[coord]]
    return idx


def _placement_kind(placement):
    """("shard", dim, split_factor or None) | ("replicate",) | ("partial",) | (other,)."""
    name = type(placement).__name__
    if name == "_StridedShard":
        return ("shard", int(placement.dim), int(placement.split_factor))
    if name == "Shard":
        return ("shard", int(placement.dim), None)
    if placement.is_replicate():
        return ("replicate",)
    if placement.is_partial():
        return ("partial",)
    return (name,)


def describe(dtensor, where, layout):
    """The Described piece of `dtensor` on this rank. `where` names the tensor in errors.

    Raises InvalidArgumentError (MALFORMED_SHARD) for anything rules 1-5 refuse.
    """
    import torch
    layout = JobLayout.of(layout)
    mesh = dtensor.device_mesh
    names = mesh.mesh_dim_names
    shape = tuple(int(n) for n in dtensor.shape)
    placements = tuple(dtensor.placements)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise errors.malformed("%s is a DTensor on a DeviceMesh this rank is not part of"
                               % where)
    if layout.coords is None:
        raise errors.malformed("%s is a DTensor, but this rank's coordinates in the job's "
                               "layout are unknown (describe DTensors through a Client)" % where)

    sharded, cuts = set(), {}
    for i, placement in enumerate(placements):
        name = names[i] if names else None
        label = repr(name) if name else "%d (unnamed)" % i
        dims = layout.layout_dims_of(name, i, mesh.ndim, mesh.size(i))
        if dims is None:
            raise errors.malformed(
                "%s is a DTensor on mesh dim %s (size %d), which is not a dim of the job's "
                "layout (%s); name the mesh dims as in the agents' --layout, or map them with "
                "tessera.Client(mesh_dims={%r: <layout dim or tuple of dims>})"
                % (where, label, mesh.size(i), layout.describe(), name if name else i))
        degree, mine = layout.degree(dims), layout.flat_coord(dims)
        if mesh.size(i) != degree or coordinate[i] != mine:
            raise errors.malformed(
                "%s is a DTensor whose mesh dim %s has size %d and puts this rank at %d, but its "
                "Tessera agent is at %d of %d on %s (layout %s, coordinates %s): start the "
                "agents with the trainers' ranks and the mesh's dim order, or map the mesh dims "
                "with tessera.Client(mesh_dims=...)"
                % (where, label, mesh.size(i), coordinate[i], mine, degree, "x".join(dims),
                   layout.describe(), layout.coords))
        kind = _placement_kind(placement)
        if kind[0] == "shard":
            if not 0 <= kind[1] < len(shape):
                raise errors.malformed("%s: placement %r shards dim %d of a %d-d tensor"
                                       % (where, placement, kind[1], len(shape)))
            sharded.update(dims)
            cuts.setdefault(kind[1], []).append((mesh.size(i), coordinate[i], kind[2]))
        elif kind[0] == "partial":
            raise errors.malformed("%s is a DTensor with a Partial placement on mesh dim %s: "
                                   "a reduction is pending; redistribute it to Replicate() or "
                                   "Shard() before saving" % (where, label))
        elif kind[0] != "replicate":
            raise errors.malformed("%s is a DTensor with placement %r on mesh dim %s, which "
                                   "Tessera cannot describe as a box" % (where, placement, label))

    offsets, lengths = [], []
    for d, size in enumerate(shape):
        idx = _indices(size, cuts.get(d, []))
        if idx and idx != list(range(idx[0], idx[0] + len(idx))):
            raise errors.malformed(
                "%s is a DTensor whose placements %s give this rank (mesh coordinate %s) "
                "indices %s of dim %d: not one contiguous box, which Tessera cannot store; "
                "redistribute it first" % (where, placements, tuple(coordinate),
                                           _shorten(idx), d))
        offsets.append(idx[0] if idx else size)
        lengths.append(len(idx))
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        from torch.distributed._tensor._utils import compute_local_shape_and_global_offset
    torch_shape, torch_offsets = compute_local_shape_and_global_offset(shape, mesh, placements)
    with torch.no_grad():
        local = dtensor.to_local()
    local_shape = tuple(int(n) for n in local.shape)
    if (tuple(lengths) != local_shape or tuple(torch_shape) != local_shape
            or any(n and o != t for o, n, t in zip(offsets, lengths, torch_offsets))):
        raise errors.malformed(
            "%s is a DTensor with placements %s whose local tensor has shape %s; Tessera "
            "computes the box offsets %s shape %s and torch offsets %s shape %s: this "
            "placement is not supported" % (where, placements, local_shape, tuple(offsets),
                                             tuple(lengths), tuple(torch_offsets),
                                             tuple(torch_shape)))
    return Described(local, shape, tuple(offsets), local_shape, layout.replica_dims(sharded))


def _shorten(idx):
    return idx if len(idx) <= 8 else idx[:4] + ["..."] + idx[-2:]
