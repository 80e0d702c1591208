"""Job-wide values: one Python value every rank of the job holds identically (an LR scheduler's
state, DCP's non-tensor entries), saved as two uint8 tensors replicated over every dim of the
job's layout — its length (8 bytes, little-endian u64) and its tessera.objects encoding,
padded to a size class (tessera.client.padded) so a value whose length changes a little keeps
the plan cached. Replicas are checked by the coordinator: ranks whose values differ fail the
save with REPLICA_DIVERGED (or a shape mismatch when their lengths differ), never keep one
rank's silently; and any rank of any later mesh reads the value back.
"""

import struct

import torch

from . import objects as objects_codec
from .client import padded
from .shards import Shard


def _keys(name):
    return name + ".header", name


def tensors(client, name, value):
    """{key: Shard} of `value` under `name`, for Client.save's mapping."""
    dims = list(client._layout.dims)  # not client.identity: that deep-copies, every save
    data = padded(objects_codec.encode(value, name))  # at least one byte
    header_key, body_key = _keys(name)
    header = torch.frombuffer(bytearray(struct.pack("<Q", len(data))), dtype=torch.uint8)
    body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return {header_key: Shard(header, [8], replicated_over=dims),
            body_key: Shard(body, [len(data)], replicated_over=dims)}


def load(client, name, step):
    """(step loaded, value) of the job-wide value `name` in checkpoint `step` (a number,
    "latest" or "newest"). Raises what Client.load raises (InvalidArgumentError if the
    checkpoint holds no such value)."""
    dims = list(client._layout.dims)
    header_key, body_key = _keys(name)
    header = torch.zeros(8, dtype=torch.uint8)
    step = client.load(step, into={header_key: Shard(header, [8], replicated_over=dims)})
    (size,) = struct.unpack("<Q", bytes(header.numpy()))
    body = torch.zeros(size, dtype=torch.uint8)
    client.load(step, into={body_key: Shard(body, [size], replicated_over=dims)})
    return step, objects_codec.decode(bytes(body.numpy()), name)
