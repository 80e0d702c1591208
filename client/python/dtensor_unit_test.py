"""Unit tests of DTensor descriptions (tessera.dtensor, tessera.layout, flatten_state of the
torch.distributed.checkpoint.state_dict dicts), with no agent: every rank of a mesh runs in a
process forked from this one under PyTorch's fake process group, which lets fully_shard and
parallelize_module shard real modules without communicating. Each rank's mapping goes through
shards.to_ref and the native DescribeShards; the test then checks, across ranks, what the
coordinator's planner relies on: the distinct boxes of every tensor tile it exactly, a box
claimed twice is claimed only inside a declared replica group, and every local tensor holds
the bytes of its box in the unsharded model."""

import multiprocessing
import traceback
import unittest

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

import tessera
import testlib
from tessera import _tessera, errors, shards
from tessera.layout import JobLayout
from tessera.state import write_back_numbers

torch.set_num_threads(1)
_FORK = multiprocessing.get_context("fork")


class Tiny(torch.nn.Module):
    """A llama-like toy whose shapes give uneven and empty FSDP shards on 4 ranks: 10 rows
    (3, 3, 3, 1), a [3] norm (rank 3 empty), a [2, 6] head (ranks 2-3 empty), a persistent
    buffer, and a frozen projection (no optimizer state)."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(10, 6)
        self.wq = torch.nn.Linear(6, 6, bias=False)
        self.wo = torch.nn.Linear(6, 6, bias=False)
        self.norm = torch.nn.Parameter(torch.rand(3))
        self.output = torch.nn.Linear(6, 2)
        self.frozen = torch.nn.Linear(6, 4, bias=False)
        self.frozen.weight.requires_grad_(False)
        self.register_buffer("freqs", torch.arange(4.0))


def tiny(seed=0):
    torch.manual_seed(seed)
    return Tiny()


def _local_bytes(t):
    return None if t is None else t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _child(rank, world, scenario, args, conn):
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        conn.send(("ok", scenario(rank, *args)))
    except tessera.TesseraError as e:
        conn.send(("tessera", type(e).__name__, e.code, e.message))
    except BaseException:  # reported to the parent, which fails the test with it
        conn.send(("crash", traceback.format_exc()))
    finally:
        conn.close()


def per_rank(world, scenario, *args, ranks=None):
    """scenario(rank, *args) in a forked process per rank of `world` (or of `ranks`), under the
    fake process group; returns [("ok", result) | ("tessera", type, code, message)] in rank
    order."""
    out = []
    for rank in (range(world) if ranks is None else ranks):
        parent, child = _FORK.Pipe(duplex=False)
        p = _FORK.Process(target=_child, args=(rank, world, scenario, args, child))
        p.start()
        child.close()
        result = parent.recv()
        p.join(60)
        if result[0] == "crash":
            raise AssertionError("rank %d crashed:\n%s" % (rank, result[1]))
        out.append(result)
    return out


def describe_all(flat, job_layout):
    """[(key, ref[:9], local bytes)] of a flatten_state mapping, checked by the native
    DescribeShards like a save."""
    refs, out = [], []
    for key, value in flat.items():
        ref, tensor = shards.to_ref(key, value, job_layout)
        refs.append(ref)
        out.append((key, ref[:10], _local_bytes(tensor)))
    try:
        _tessera.describe(list(job_layout.degrees.items()), refs)
    except _tessera.StatusError as e:
        raise errors.from_status(*e.args) from None
    return out


def coords_of(rank, degrees):
    """Row-major coordinates of `rank` in a layout (as the agents number ranks)."""
    coords = {}
    for dim in reversed(list(degrees)):
        coords[dim] = rank % degrees[dim]
        rank //= degrees[dim]
    return dict(reversed(list(coords.items())))


def fsdp_state(rank, degrees, mesh_names, plan=None, shard_mesh=None, fully_shard_mesh=None):
    """flatten_state of get_model_state_dict / get_optimizer_state_dict of Tiny sharded on a
    mesh of `degrees` (dims named mesh_names), described against the job layout of the same
    dims; returns describe_all's list."""
    mesh = init_device_mesh("cpu", tuple(degrees.values()), mesh_dim_names=mesh_names)
    model = tiny()
    if plan:
        parallelize_module(model, mesh["tp"], plan, src_data_rank=None)
    fully_shard(model.frozen, mesh=mesh[fully_shard_mesh] if fully_shard_mesh else mesh)
    fully_shard(model, mesh=mesh[fully_shard_mesh] if fully_shard_mesh else mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)  # frozen: in it, without state
    flat = tessera.flatten_state(get_model_state_dict(model),
                                 get_optimizer_state_dict(model, optimizer))
    return describe_all(flat, JobLayout(degrees, coords_of(rank, degrees)))


def reference():
    """Every tensor of the unsharded Tiny (and its AdamW state after DSD's initialisation
    step with zero gradients and lr 0: moments zero, step 1), by key."""
    model = tiny()
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            full[name + "#exp_avg"] = torch.zeros_like(p)
            full[name + "#exp_avg_sq"] = torch.zeros_like(p)
            full[name + "#step"] = torch.tensor(1.0)
    return full


class Coverage:
    """Checks the pieces all ranks described, as the planner would see them."""

    def __init__(self, test, results, degrees):
        self.test, self.degrees = test, degrees
        self.by_key = {}
        for rank, result in enumerate(results):
            test.assertEqual(result[0], "ok", "rank %d: %s" % (rank, result))
            for key, ref, data in result[1]:
                self.by_key.setdefault(key, []).append((rank, ref, data))

    def ref(self, key, rank):
        return next(r for k, r, _ in self.by_key[key] if k == rank)

    def check(self, full=None):
        for key, claims in self.by_key.items():
            fqn, kind, dtype, shape = claims[0][1][:4]
            if claims[0][1][9]:  # absent: nothing to tile
                continue
            seen = torch.zeros(shape, dtype=torch.int32) if shape else torch.zeros((), dtype=torch.int32)
            boxes = {}
            for rank, ref, data in claims:
                self.test.assertEqual(ref[3], shape, key)
                offsets, lengths = ref[4] or [0] * len(shape), ref[5] or list(shape)
                box = tuple(offsets), tuple(lengths)
                if 0 in lengths:  # an empty shard holds nothing to tile (legal, DESIGN.md)
                    self.test.assertEqual(data, b"", key)
                    continue
                if box in boxes:
                    other, other_ref, other_data = boxes[box]
                    differ = {d for d in self.degrees
                              if coords_of(rank, self.degrees)[d] != coords_of(other, self.degrees)[d]}
                    self.test.assertTrue(differ <= set(ref[7]),
                                         "%s: ranks %d and %d claim %s but are replicas only over "
                                         "%s" % (key, other, rank, box, ref[7]))
                    self.test.assertEqual(data, other_data, "%s: replicas differ" % key)
                    continue
                boxes[box] = (rank, ref, data)
                index = tuple(slice(o, o + n) for o, n in zip(*box))
                seen[index] += 1
                if full is not None:
                    expected = full[key][index] if shape else full[key]
                    self.test.assertEqual(data, _local_bytes(expected),
                                          "%s: rank %d's box %s holds other bytes" % (key, rank, box))
            self.test.assertTrue(bool((seen == 1).all()),
                                 "%s: the boxes do not tile %s exactly: %s" % (key, shape, seen))
        return self


class DTensorBoxesTest(unittest.TestCase):
    def test_Fsdp1D_UnevenAndEmptyShards_TileEveryTensorWithItsBytes(self):
        degrees = {"dp_shard": 4}
        cov = Coverage(self, per_rank(4, fsdp_state, degrees, ("dp_shard",)), degrees)
        cov.check(reference())
        # torch.chunk's cut: 10 rows as 3, 3, 3, 1; the [3] norm leaves rank 3 empty at
        # offset 3; the [2] head bias leaves ranks 2 and 3 empty.
        self.assertEqual([cov.ref("tok_embeddings.weight", r)[4:6] for r in range(4)],
                         [([0, 0], [3, 6]), ([3, 0], [3, 6]), ([6, 0], [3, 6]), ([9, 0], [1, 6])])
        self.assertEqual(cov.ref("norm", 3)[4:6], ([3], [0]))
        self.assertEqual([cov.ref("output.bias", r)[5] for r in range(4)], [[1], [1], [0], [0]])
        for key in ("wq.weight", "norm#exp_avg"):
            self.assertEqual(cov.ref(key, 0)[7], [], key)  # sharded: no replica
        # The step count and the buffer: held alike by every rank.
        self.assertEqual(cov.ref("wq.weight#step", 1)[7], ["dp_shard"])
        self.assertEqual(cov.ref("freqs", 2)[7], ["dp_shard"])
        # The frozen weight has no optimizer state: an explicit absent marker in its box.
        absent = cov.ref("frozen.weight#", 1)
        self.assertEqual((absent[1], absent[9], absent[4], absent[5]),
                         (shards.KIND_OPTIMIZER, True, [1, 0], [1, 6]))

    def test_FsdpTimesTp_StridedShard_ContiguousBoxesThatTile(self):
        degrees = {"dp_shard": 2, "tp": 2}
        plan = {"wq": ColwiseParallel(), "wo": RowwiseParallel(), "tok_embeddings": RowwiseParallel()}
        results = per_rank(4, fsdp_state, degrees, ("dp_shard", "tp"), plan, None, "dp_shard")
        cov = Coverage(self, results, degrees).check(reference())
        # wq: TP splits rows 0-2 | 3-5, FSDP splits each again: (dp, tp) -> rows.
        self.assertEqual([cov.ref("wq.weight", r)[4:6] for r in range(4)],
                         [([0, 0], [2, 6]), ([3, 0], [2, 6]), ([2, 0], [1, 6]), ([5, 0], [1, 6])])
        self.assertEqual(cov.ref("wo.weight", 3)[4:6], ([3, 3], [3, 3]))
        # Not TP-parallelized: on the dp_shard submesh, a replica over tp.
        self.assertEqual(cov.ref("norm", 1)[7], ["tp"])
        self.assertEqual(cov.ref("wq.weight", 1)[7], [])

    def test_Hsdp_ReplicatePlacement_ReplicatedOverDpReplicate(self):
        degrees = {"dp_replicate": 2, "dp_shard": 2}
        cov = Coverage(self, per_rank(4, fsdp_state, degrees, ("dp_replicate", "dp_shard")),
                       degrees).check(reference())
        self.assertEqual(cov.ref("wq.weight", 3)[7], ["dp_replicate"])
        self.assertEqual(cov.ref("wq.weight", 3)[4:6], ([3, 0], [3, 6]))

    def test_FlattenedMeshDim_MappedToLayoutDims(self):
        def scenario(rank, mesh_dims):
            mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard_cp",))
            model = tiny()
            fully_shard(model, mesh=mesh)
            degrees = {"dp_shard": 2, "cp": 2}
            return describe_all(tessera.flatten_state(get_model_state_dict(model)),
                                JobLayout(degrees, coords_of(rank, degrees), mesh_dims=mesh_dims))
        degrees = {"dp_shard": 2, "cp": 2}
        cov = Coverage(self, per_rank(4, scenario, {"dp_shard_cp": ("dp_shard", "cp")}),
                       degrees).check()
        self.assertEqual(cov.ref("tok_embeddings.weight", 2)[4], [6, 0])
        refused = per_rank(4, scenario, None, ranks=[0])[0]
        self.assertEqual(refused[:3], ("tessera", "InvalidArgumentError", "MALFORMED_SHARD"))
        self.assertIn("'dp_shard_cp'", refused[3])
        self.assertIn("mesh_dims", refused[3])

    def test_UnnamedMesh_MapsToTheOnlyLayoutDim(self):
        def scenario(rank, degrees):
            model = tiny()
            fully_shard(model)  # the default mesh: 1-D, without names
            return describe_all(tessera.flatten_state(get_model_state_dict(model)),
                                JobLayout(degrees, coords_of(rank, degrees)))
        Coverage(self, per_rank(2, scenario, {"dp": 2}), {"dp": 2}).check(reference())
        refused = per_rank(1, scenario, {"pp": 1, "dp": 1})[0]
        self.assertEqual(refused[2], "MALFORMED_SHARD")
        self.assertIn("0 (unnamed)", refused[3])

    def test_PipelineStages_SplitDimNeverAReplica(self):
        def scenario(rank):
            degrees = {"pp": 2, "dp_shard": 2}
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp_shard"))
            model = tiny(seed=rank // 2)  # one stage's module per pp coordinate
            fully_shard(model, mesh=mesh["dp_shard"])
            return describe_all(tessera.flatten_state(get_model_state_dict(model)),
                                JobLayout(degrees, coords_of(rank, degrees)))
        results = per_rank(4, scenario)
        cov = Coverage(self, results, {"pp": 2, "dp_shard": 2})
        self.assertEqual(cov.ref("wq.weight", 2)[7], [])
        self.assertEqual(cov.ref("freqs", 2)[7], ["dp_shard"])
        # Both stages named their layers alike: the same boxes from ranks that differ in pp,
        # which is in no replicated_over — what the planner refuses as DUPLICATE_FQN.
        with self.assertRaisesRegex(AssertionError, "replicas only over"):
            cov.check()

    def test_CoordinatesDisagreeWithAgent_RefusedNamingTensor(self):
        def scenario(rank):
            degrees = {"dp_shard": 2, "tp": 2}
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
            model = tiny()
            fully_shard(model, mesh=mesh["dp_shard"])
            swapped = {"dp_shard": rank % 2, "tp": rank // 2}  # agents numbered tp-major
            return describe_all(get_model_state_dict(model), JobLayout(degrees, swapped))
        refused = per_rank(4, scenario, ranks=[1])[0]
        self.assertEqual(refused[:3], ("tessera", "InvalidArgumentError", "MALFORMED_SHARD"))
        self.assertRegex(refused[3], r"tensor '\w[\w.]*' is a DTensor whose mesh dim 'dp_shard' "
                                     r"has size 2 and puts this rank at 0, but its Tessera agent "
                                     r"is at 1 of 2")

    def test_PartialNonContiguousAndScatteredStrided_Refused(self):
        def scenario(rank, which):
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            if which == "partial":
                t = DTensor.from_local(torch.ones(4), mesh, [Partial(), Shard(0)],
                                       shape=(8,), stride=(1,))
            elif which == "transposed":  # a local tensor that is a non-contiguous view
                t = DTensor.from_local(torch.ones(3, 4).t(), mesh, [Shard(0), Shard(1)],
                                       shape=(8, 6), stride=(6, 1))
            else:  # rows {0, 2} of 8 on rank 0: not one box
                t = DTensor.from_local(torch.ones(2, 3), mesh, [Shard(0), _StridedShard(0, split_factor=2)],
                                       shape=(8, 3), stride=(3, 1))
            degrees = {"dp": 2, "tp": 2}
            return describe_all({"w": t}, JobLayout(degrees, coords_of(rank, degrees)))
        partial = per_rank(4, scenario, "partial", ranks=[0])[0]
        self.assertEqual(partial[2], "MALFORMED_SHARD")
        self.assertIn("tensor 'w' is a DTensor with a Partial placement on mesh dim 'dp'", partial[3])
        transposed = per_rank(4, scenario, "transposed", ranks=[0])[0]
        self.assertEqual(transposed[2], "MALFORMED_SHARD")
        self.assertIn("tensor 'w' is not contiguous", transposed[3])
        strided = per_rank(4, scenario, "strided", ranks=[0])[0]
        self.assertEqual(strided[2], "MALFORMED_SHARD")
        self.assertIn("tensor 'w'", strided[3])
        self.assertIn("not one contiguous box", strided[3])

    def test_JobLayout_MeshDimsNamingUnknownDim_Refused(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "'nope'.*dp=2"):
            JobLayout({"dp": 2}, {"dp": 0}, mesh_dims={"dp_shard": "nope"})
        self.assertEqual(JobLayout({"pp": 2, "dp": 2, "tp": 2}).replica_dims({"dp"}), ["tp"])


class DsdFlattenStateTest(unittest.TestCase):
    def test_FlattenState_DsdDictsWithNumbers_WrittenBackIntoTheDict(self):
        def scenario(rank):
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
            model = tiny()
            fully_shard(model, mesh=mesh)
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
            osd = get_optimizer_state_dict(model, optimizer)
            osd["state"]["norm"]["count"] = 7  # a Python number, as some optimizers keep
            flat = tessera.flatten_state(get_model_state_dict(model), osd)
            number = flat["norm#count"]
            refs = describe_all(flat, JobLayout({"dp_shard": 2}, {"dp_shard": rank}))
            number.tensor.fill_(11)  # what a load writes
            write_back_numbers(flat)
            return (sorted(k for k in flat if k.startswith("norm")),
                    osd["state"]["norm"]["count"], [r[1][7] for r in refs if r[0] == "norm#count"])
        keys, count, replicated = per_rank(2, scenario, ranks=[0])[0][1]
        self.assertEqual(keys, ["norm", "norm#count", "norm#exp_avg", "norm#exp_avg_sq", "norm#step"])
        self.assertEqual(count, 11)
        self.assertEqual(replicated, [["dp_shard"]])


if __name__ == "__main__":
    testlib.main()
