"""tessera: save and load training checkpoints through a Tessera agent (PyTorch users).

Each trainer rank talks to the Tessera agent beside it over a unix socket; the agent and the
coordinator validate the job's global plan, persist, verify and commit (DESIGN.md). A save
blocks training only while the rank's tensors are copied into the agent's shared-memory
staging (the GIL is released meanwhile)::

    import tessera
    client = tessera.Client()                       # $TESSERA_AGENT: the agent's socket
    state = tessera.flatten_state(model.state_dict(), optimizer)
    client.save(step, state, objects={
        "param_groups": optimizer.state_dict()["param_groups"],
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": numpy.random.get_state(),
                "python": random.getstate()},
        "loader": {"epoch": epoch, "batch": batch}})
    client.wait(step)                               # optional: until committed

    # Resume (possibly on another layout): fresh model and optimizer, state materialised.
    tessera.init_optimizer_state(optimizer)
    state = tessera.flatten_state(model.state_dict(), optimizer)
    for key in [k for k, v in state.items() if isinstance(v, tessera.Absent)]:
        del state[key]      # frozen parameters (requires_grad=False) have no state to fill
    step, objs = client.load("latest", into=state, objects=True)
    # A parameter the checkpoint saved without optimizer state is left without state again.

Tensors (``save(step, tensors)`` / ``load(step, into=...)``): a mapping key -> value where

* a plain CPU/CUDA ``torch.Tensor`` or ``numpy.ndarray`` under ``"<fqn>"`` is a whole
  parameter (or buffer) replicated over ``dp``; under ``"<fqn>#<state_key>"`` it is whole
  optimizer state of that parameter (kind=optimizer, fqn=<fqn>, state_key on the wire);
* ``tessera.Shard(tensor, global_shape, offsets=None, flat_range=None, replicated_over=None,
  kind="param"|"optimizer", state_key=None, *, local_shape=None)`` describes a piece
  explicitly (TP/FSDP boxes; distributed-optimizer flat ranges);
* ``tessera.Absent(...)`` (under ``"<fqn>#"``) declares that this rank has no optimizer state
  for the parameter yet — saved as an explicit absent marker, never a KeyError;
* a DTensor (FSDP2's ``fully_shard``, ``parallelize_module``, ``distribute_tensor``) is
  described from its placements and the job's layout (``tessera.dtensor``); the state dicts
  of ``get_model_state_dict`` / ``get_optimizer_state_dict`` go through ``flatten_state`` as
  they are, and a load fills their DTensors in place on whatever mesh the loading job has::

      model_sd = get_model_state_dict(model)
      optim_sd = get_optimizer_state_dict(model, optimizer)
      client.save(step, tessera.flatten_state(model_sd, optim_sd))
      ...
      step = client.load("latest", into=tessera.flatten_state(model_sd, optim_sd))
      # strict=False: a parameter the checkpoint saved without optimizer state (before its
      # first step) is left without it, not given the state get_optimizer_state_dict made up.
      set_optimizer_state_dict(model, optimizer, optim_sd,
                               options=StateDictOptions(strict=False))

``replicated_over=None`` means ``["dp"]`` if the mesh has ``dp`` and the piece has no flat
range, else ``[]``. Supported dtypes: float32/64/16, bfloat16, int8/16/32/64, uint8 (+ uint16/
32/64 and float8 where the library has them), bool; 0-d tensors are fine. Tensors must be
contiguous: a non-contiguous tensor is refused with InvalidArgumentError (MALFORMED_SHARD),
never copied implicitly — pass ``t.contiguous()`` to save it.

Objects (``objects={name: value}``): non-tensor state, stored per rank as extra shards
``objects.<name>`` in a non-executable encoding — UTF-8 JSON
``{"format": "tessera.objects/1", "value": V}`` with tagged values (``{"$bytes": base64}``,
``{"$tuple": [...]}``, ``{"$dict": [[k, v], ...]}`` for non-string keys, ``{"$float": "nan"}``,
``{"$tensor": {"dtype", "shape", "data": base64 of raw little-endian bytes}}``,
``{"$ndarray": {...}}``); full table in ``tessera.objects``. Decoding never runs code (no
pickle). Two more per-rank extras index them so a load knows their sizes:
``tessera.objects.header`` (8 bytes, little-endian u64: the index's length) and
``tessera.objects.index`` (JSON ``{"format": "tessera.objects.index/1", "objects": [[name,
nbytes], ...]}``); every save writes them, with or without objects. The index and each object
are padded with spaces (JSON whitespace) to a size class (tessera.client.padded), so objects
whose length changes slightly between saves keep the plan cached. Objects are per rank: a
load returns the objects this rank saved, so resuming on another world size must supply
ranks that did not exist from elsewhere.

Errors: every failure is a ``tessera.TesseraError`` subclass chosen by who retries
(``InvalidArgumentError`` for a bad tensor or rejected plan, ``AbortedError``: save again,
``UnavailableError``: retry the call, ...), with ``.code`` ("DUPLICATE_FQN", "STEP_EXISTS",
... or the status name for transport errors), ``.message``, ``.fqns``, ``.ranks``,
``.state_key`` and ``.path``.
"""

from .errors import (AbortedError, DataLossError, DeadlineExceededError,
                     FailedPreconditionError, InternalError, InvalidArgumentError, NotFoundError,
                     ResourceExhaustedError, TesseraError, UnavailableError)
from .shards import DTYPES, Absent, Shard
from .state import flatten_state, init_optimizer_state
from .client import Client, SaveResult
from . import objects

__all__ = [
    "Client", "SaveResult", "Shard", "Absent", "DTYPES", "flatten_state",
    "init_optimizer_state", "objects", "TesseraError", "InvalidArgumentError", "AbortedError",
    "FailedPreconditionError", "NotFoundError", "DataLossError", "UnavailableError",
    "DeadlineExceededError", "ResourceExhaustedError", "InternalError",
]
