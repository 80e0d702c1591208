"""JobLayout: the job's mesh as this rank's agent reports it, and how PyTorch DeviceMesh dims
map onto it.

The agents of a job are started with one layout (``tessera-agent --layout=pp=2,dp_shard=4,
tp=2``); every rank knows its coordinate on each of those dims (``Client.identity``). DTensors
name the dims of their own DeviceMesh. This object holds both and the rules that relate them
(tessera.dtensor applies them):

* ``mesh_dims``: DeviceMesh dim -> layout dim(s). A named mesh dim maps to the layout dim of
  the same name unless this mapping says otherwise; the value may be a tuple of layout dims for
  a flattened mesh dim (torchtitan's ``"dp_shard_cp"`` -> ``("dp_shard", "cp")``, row-major).
  Keys may also be ints, the dims of a mesh without names.
* ``split_dims``: layout dims along which ranks hold *different parts of the model* — by
  default ``("pp",)``: pipeline stages hold different layers. A tensor is never declared a
  replica over them; over every other dim that does not shard it, it is (see
  ``replica_dims``).

Immutable; no I/O. Raises InvalidArgumentError (MALFORMED_SHARD) for a mapping that names dims
the layout does not have.
"""

import math

from . import errors

__all__ = ["JobLayout", "DEFAULT_SPLIT_DIMS"]

DEFAULT_SPLIT_DIMS = ("pp",)


def _names(value, what):
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise errors.malformed("%s must name layout dims (a str or a tuple of str), not %r"
                               % (what, value))
    return names


class JobLayout:
    """The job's layout, this rank's coordinates in it, and the DeviceMesh dim mapping.

    Args:
      degrees: {dim: degree} in the layout's order.
      coords: {dim: coordinate} of this rank, or None where unknown (a DTensor then cannot
        be checked against the agent, and is refused).
      mesh_dims: {DeviceMesh dim name or index: layout dim or tuple of layout dims}. Default:
        names map to themselves.
      split_dims: layout dims that split the model (never replicas). Default: ("pp",).
    """

    __slots__ = ("degrees", "dims", "coords", "mesh_dims", "split_dims")

    def __init__(self, degrees, coords=None, mesh_dims=None, split_dims=DEFAULT_SPLIT_DIMS):
        self.degrees = {str(d): int(n) for d, n in dict(degrees).items()}
        self.dims = tuple(self.degrees)
        self.coords = None if coords is None else {str(d): int(c) for d, c in dict(coords).items()}
        mapping = {}
        for key, value in dict(mesh_dims or {}).items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise errors.malformed("mesh_dims keys are DeviceMesh dim names or indices, not "
                                       "%r" % (key,))
            names = _names(value, "mesh_dims[%r]" % (key,))
            unknown = [n for n in names if n not in self.degrees]
            if unknown:
                raise errors.malformed(
                    "mesh_dims[%r] names %s, which the job's layout (%s) does not have"
                    % (key, ", ".join(map(repr, unknown)), self.describe()))
            mapping[key] = names
        self.mesh_dims = mapping
        self.split_dims = _names(split_dims, "split_dims") if split_dims else ()

    @classmethod
    def of(cls, value):
        """A JobLayout, or one made from a sequence of dim names (degrees and coordinates
        unknown; enough for plain tensors and Shards)."""
        if isinstance(value, JobLayout):
            return value
        return cls({d: 0 for d in value})

    def describe(self):
        return ",".join("%s=%d" % kv for kv in self.degrees.items()) or "(no dims)"

    def layout_dims_of(self, mesh_dim_name, mesh_dim_index, mesh_ndim, mesh_size):
        """The layout dims a DeviceMesh dim stands for (rule 1 of tessera.dtensor), or None if
        none is known: the mapping, else the same name, else (the only dim of an unnamed 1-D
        mesh) the layout's only dim."""
        for key in (mesh_dim_name, mesh_dim_index):
            if key is not None and key in self.mesh_dims:
                return self.mesh_dims[key]
        if mesh_dim_name is not None:
            return (mesh_dim_name,) if mesh_dim_name in self.degrees else None
        if mesh_ndim == 1 and len(self.dims) == 1:
            return self.dims
        return None

    def degree(self, dims):
        return math.prod(self.degrees[d] for d in dims)

    def flat_coord(self, dims):
        """This rank's row-major coordinate on the product of `dims`, or None if unknown."""
        if self.coords is None:
            return None
        c = 0
        for d in dims:
            c = c * self.degrees[d] + self.coords.get(d, 0)
        return c

    def replica_dims(self, sharded_dims):
        """Layout dims a piece sharded along `sharded_dims` is a replica over: all the others
        but the split dims."""
        return [d for d in self.dims if d not in sharded_dims and d not in self.split_dims]
