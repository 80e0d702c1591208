"""Unit tests of the `tessera` Python module that need no agent: flatten_state, the objects
encoding, refusals of unsupported tensors, Shard checks, error mapping, and the native
module's own shard checks (client/describe.h through _tessera.describe)."""

import math
import random
import struct
import unittest

import numpy
import torch

import tessera
import testlib
from tessera import _tessera, errors, objects, shards
from tessera import client as client_module
from tessera import dcp as tessera_dcp
from tessera.layout import JobLayout

torch.set_num_threads(1)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.fc2 = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


PARAMS = ["fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"]
BUFFERS = ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]


def make(seed=0):
    torch.manual_seed(seed)
    model = Net()
    return model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)


def one_step(model, optimizer):
    loss = model(torch.arange(8.0).reshape(2, 4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def describe(mesh, mapping, for_load=False):
    """Runs every entry through to_ref and the native DescribeShards; returns the refs."""
    dims = [name for name, _ in mesh]
    refs = [shards.to_ref(k, v, dims, for_load)[0] for k, v in mapping.items()]
    try:
        _tessera.describe(mesh, refs)
    except _tessera.StatusError as e:
        raise errors.from_status(*e.args) from None
    return refs


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()


class StubNative:
    """The native client's load, without an agent: it fills nothing, and reports absent the
    optimizer refs of `absent_fqns` and the extras named in `absent_extras` (as the agent does
    for state saved as absent and for extras of ranks that did not exist at save time)."""

    def __init__(self, absent_fqns=(), absent_extras=()):
        self.absent_fqns = set(absent_fqns)
        self.absent_extras = set(absent_extras)
        self.refusals = []  # (step, code, message) of each refuse()

    def refuse(self, step, code, message):
        self.refusals.append((step, code, message))

    def load(self, step, refs):
        absent = [i for i, r in enumerate(refs)
                  if (r[1] == shards.KIND_OPTIMIZER and r[0] in self.absent_fqns)
                  or (r[1] == shards.KIND_EXTRA and r[0] in self.absent_extras)]
        return step, absent, dict(client_module._NO_SOURCES)


def stub_client(native, rank=3):
    """A tessera.Client talking to `native` instead of an agent, on a dp=2 layout."""
    client = tessera.Client.__new__(tessera.Client)
    client._native = native
    client._identity = {"job": "j", "rank": rank, "coords": {"dp": rank % 2},
                        "layout": {"dp": 2}, "has_gpu": False, "coordinator": ""}
    client._layout = JobLayout({"dp": 2}, {"dp": rank % 2})
    client.last_absent = []
    client.last_load = dict(client_module._NO_SOURCES)
    return client


class FlattenStateTest(unittest.TestCase):
    def test_FlattenState_BeforeFirstStep_AbsentMarkers(self):
        model, optimizer = make()
        flat = tessera.flatten_state(model.state_dict(), optimizer)
        self.assertEqual(set(flat), set(PARAMS + BUFFERS + [p + "#" for p in PARAMS]))
        for p in PARAMS:
            marker = flat[p + "#"]
            self.assertIsInstance(marker, tessera.Absent)
            self.assertEqual(marker.global_shape, tuple(model.state_dict()[p].shape))
            self.assertEqual(marker.dtype, "F32")
        refs = describe([("dp", 2)], flat)
        absent = [r for r in refs if r[9]]
        self.assertEqual(len(absent), len(PARAMS))
        for r in absent:  # kind optimizer, no state key, nothing staged, replicated over dp
            self.assertEqual((r[1], r[8], r[11], r[7]), (shards.KIND_OPTIMIZER, "", 0, ["dp"]))

    def test_FlattenState_AfterOneStep_ExpAvgExpAvgSqStep(self):
        model, optimizer = make()
        one_step(model, optimizer)
        flat = tessera.flatten_state(model.state_dict(), optimizer)
        expected = set(PARAMS + BUFFERS)
        for p in PARAMS:
            expected |= {p + "#exp_avg", p + "#exp_avg_sq", p + "#step"}
        self.assertEqual(set(flat), expected)
        params = dict(model.named_parameters())
        for p in PARAMS:
            state = optimizer.state[params[p]]
            # The mapping aliases the live optimizer state: a load restores it in place.
            self.assertIs(flat[p + "#exp_avg"], state["exp_avg"])
            self.assertIs(flat[p + "#step"], state["step"])
            self.assertEqual(flat[p + "#step"].dim(), 0)
            self.assertEqual(flat[p].data_ptr(), params[p].data_ptr())
        refs = {r[0] + ("#" + r[8] if r[1] == shards.KIND_OPTIMIZER else ""): r
                for r in describe([("dp", 2)], flat)}
        step = refs["fc1.weight#step"]
        self.assertEqual((step[1], step[2], step[3], step[8], step[11]),
                         (shards.KIND_OPTIMIZER, "F32", [], "step", 4))
        self.assertEqual(refs["norm.num_batches_tracked"][2], "I64")
        self.assertEqual(refs["fc1.weight#exp_avg"][3], [3, 4])

    def test_FlattenState_FrozenParameter_StaysAbsentAfterStep(self):
        model, optimizer = make()
        model.fc2.bias.requires_grad_(False)
        one_step(model, optimizer)
        flat = tessera.flatten_state(model.state_dict(), optimizer)
        self.assertIsInstance(flat["fc2.bias#"], tessera.Absent)
        self.assertNotIn("fc2.bias#exp_avg", flat)
        self.assertIn("fc2.weight#exp_avg", flat)

    def test_FlattenState_ParamNames_ListDictModuleAgree(self):
        model, optimizer = make()
        one_step(model, optimizer)
        by_identity = tessera.flatten_state(model.state_dict(), optimizer)
        osd = optimizer.state_dict()
        for names in (PARAMS, dict(enumerate(PARAMS))):
            flat = tessera.flatten_state(model.state_dict(), osd, param_names=names)
            self.assertEqual(set(flat), set(by_identity))
            self.assertTrue(torch.equal(flat["fc2.weight#exp_avg"],
                                        by_identity["fc2.weight#exp_avg"]))
        flat = tessera.flatten_state(model.state_dict(), optimizer, param_names=model)
        self.assertEqual(set(flat), set(by_identity))

    def test_FlattenState_StateDictWithoutNames_Refused(self):
        model, optimizer = make()
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "param_names"):
            tessera.flatten_state(model.state_dict(), optimizer.state_dict())
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "6 parameters"):
            tessera.flatten_state(model.state_dict(), optimizer.state_dict(),
                                  param_names=PARAMS[:2])

    def test_FlattenState_ClonedStateDict_AsksForParamNames(self):
        model, optimizer = make()
        cloned = {k: v.clone() for k, v in model.state_dict().items()}
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "param_names"):
            tessera.flatten_state(cloned, optimizer)

    def test_FlattenState_ShardedParameter_StateInheritsBox(self):
        local = torch.zeros(2, 3)
        model_sd = {"w": tessera.Shard(local, (4, 3), offsets=(2, 0), replicated_over=[])}
        osd = {"state": {0: {"exp_avg": torch.ones(2, 3), "step": torch.tensor(5.0)}},
               "param_groups": [{"lr": 0.1, "params": [0]}]}
        flat = tessera.flatten_state(model_sd, osd, param_names=["w"])
        exp_avg, step = flat["w#exp_avg"], flat["w#step"]
        self.assertEqual((exp_avg.global_shape, exp_avg.offsets, exp_avg.kind, exp_avg.state_key),
                         ((4, 3), (2, 0), "optimizer", "exp_avg"))
        self.assertEqual((step.global_shape, step.offsets), ((), ()))
        refs = describe([("pp", 2)], flat)
        self.assertEqual(refs[1][4:6], ([2, 0], [2, 3]))

    def test_FlattenState_ShardedParameterStep_ReplicaOverWholeMesh(self):
        # FSDP x TP: every rank holds a different box of "w", but the same AdamW step count;
        # as a replica of "w"'s (empty) replicated_over it would be a DUPLICATE_FQN.
        w = torch.nn.Parameter(torch.zeros(1, 3))
        optimizer = torch.optim.AdamW([w], lr=0.1)
        w.grad = torch.ones(1, 3)
        optimizer.step()
        model_sd = {"w": tessera.Shard(w.data, (4, 6), offsets=(1, 3), replicated_over=[])}
        flat = tessera.flatten_state(model_sd, optimizer)
        mesh = [("dp_shard", 2), ("tp", 2)]
        refs = dict((r[0] + "#" + r[8], r) for r in describe(mesh, flat))
        self.assertEqual(refs["w#step"][3:8], ([], [], [], None, ["dp_shard", "tp"]))
        self.assertEqual(refs["w#exp_avg"][3:8], ([4, 6], [1, 3], [1, 3], None, []))

    def test_FlattenState_EmptyShardsOfOneShape_EachNamedOnce(self):
        # An FSDP2 rank past the last chunk of two small parameters holds two empty shards of
        # the same shape; both have data pointer 0, yet each keeps its own optimizer state.
        a, b = torch.nn.Parameter(torch.zeros(0, 8)), torch.nn.Parameter(torch.zeros(0, 8))
        optimizer = torch.optim.AdamW([a, b], lr=0.1)
        a.grad, b.grad = torch.zeros(0, 8), torch.zeros(0, 8)
        optimizer.step()
        model_sd = {"a": tessera.Shard(a.data, (2, 8), offsets=(2, 0), replicated_over=[]),
                    "b": tessera.Shard(b.data, (3, 8), offsets=(3, 0), replicated_over=[])}
        flat = tessera.flatten_state(model_sd, optimizer)
        for name, rows in (("a", 2), ("b", 3)):
            for key in ("exp_avg", "exp_avg_sq", "step"):
                self.assertIn("%s#%s" % (name, key), flat)
            self.assertEqual(flat[name + "#exp_avg"].global_shape, (rows, 8))
            self.assertEqual(flat[name + "#exp_avg"].local_shape, (0, 8))
        describe([("dp_shard", 3)], flat)  # the native checks accept the empty boxes

    def test_FlattenState_NumberState_StagedAsTensorAndWrittenBack(self):
        class CountingSgd(torch.optim.Optimizer):
            def __init__(self, params):
                super().__init__(params, {"lr": 0.1})

            def step(self, closure=None):
                for group in self.param_groups:
                    for p in group["params"]:
                        self.state[p]["count"] = self.state[p].get("count", 0) + 1

        w = torch.nn.Parameter(torch.zeros(2))
        optimizer = CountingSgd([w])
        optimizer.step()
        flat = tessera.flatten_state({"w": w.detach()}, optimizer)
        count = flat["w#count"]
        self.assertEqual((count.tensor.dtype, count.tensor.item()), (torch.int64, 1))
        count.tensor.fill_(41)  # what a load would write
        tessera.state.write_back_numbers(flat)
        self.assertEqual(optimizer.state[w]["count"], 41)
        self.assertIs(type(optimizer.state[w]["count"]), int)

    def test_FlattenState_NumberStateOfIdKeyedStateDict_WrittenBackIntoIt(self):
        w = torch.zeros(2)
        osd = {"state": {0: {"count": 1}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
        flat = tessera.flatten_state({"w": w}, osd, param_names=["w"])
        flat["w#count"].tensor.fill_(41)  # what a load would write
        tessera.state.write_back_numbers(flat)
        self.assertEqual(osd["state"][0]["count"], 41)

    def test_FlattenState_NonTensorEntry_Refused(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "objects="):
            tessera.flatten_state({"w": torch.zeros(1), "extra": {"a": 1}})


class InitOptimizerStateTest(unittest.TestCase):
    def test_InitOptimizerState_FreshAdamW_StateCreatedParamsUnchanged(self):
        model, optimizer = make()
        before = {k: bits(v) for k, v in model.state_dict().items()}
        tessera.init_optimizer_state(optimizer)
        self.assertEqual({k: bits(v) for k, v in model.state_dict().items()}, before)
        for p in model.parameters():
            self.assertEqual(set(optimizer.state[p]), {"step", "exp_avg", "exp_avg_sq"})
            self.assertIsNone(p.grad)
        self.assertEqual(optimizer.param_groups[0]["lr"], 0.1)
        flat = tessera.flatten_state(model.state_dict(), optimizer)
        self.assertFalse(any(isinstance(v, tessera.Absent) for v in flat.values()))

    def test_InitOptimizerState_ExistingState_Untouched(self):
        model, optimizer = make()
        one_step(model, optimizer)
        model.fc2.bias.requires_grad_(False)
        state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
        tessera.init_optimizer_state(optimizer)
        for p, s in optimizer.state.items():
            for k, v in s.items():
                self.assertTrue(torch.equal(v, state[id(p)][k]), k)


class LoadIntoFlatStateTest(unittest.TestCase):
    """Client.load into a flatten_state mapping, against a stub native client."""

    def test_Load_StateSavedAbsent_FakeStateOfOptimizerDropped(self):
        # The documented resume flow: init_optimizer_state gives every parameter step=1 and
        # zero moments; a parameter the checkpoint saved without state must not keep them.
        model, optimizer = make()
        tessera.init_optimizer_state(optimizer)
        flat = tessera.flatten_state(model.state_dict(), optimizer)
        client = stub_client(StubNative(absent_fqns={"fc2.bias"}))
        client.load(5, into=flat)
        self.assertEqual(sorted(client.last_absent),
                         ["fc2.bias#exp_avg", "fc2.bias#exp_avg_sq", "fc2.bias#step"])
        params = dict(model.named_parameters())
        self.assertEqual(optimizer.state.get(params["fc2.bias"], {}), {})
        self.assertEqual(set(optimizer.state[params["fc2.weight"]]),
                         {"step", "exp_avg", "exp_avg_sq"})
        # The mapping now says what the optimizer holds: a save of it declares the state absent.
        self.assertIsInstance(flat["fc2.bias#"], tessera.Absent)
        self.assertNotIn("fc2.bias#exp_avg", flat)
        # Until a step gives the parameter state again: the mapping no longer says what the
        # optimizer holds, and a save of it is refused rather than saving that state absent.
        client._refs = lambda tensors, for_load: ([], [], None)  # no agent: stop before it
        client._save_refs(flat, None)
        one_step(model, optimizer)
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    "'fc2.bias' absent .* build the mapping again"):
            client.save(6, flat)
        # The refusal went to the agent, for the other ranks (issue 52, bug 4).
        self.assertEqual(len(client._native.refusals), 1)
        step, code, message = client._native.refusals[0]
        self.assertEqual((step, code), (6, "MALFORMED_SHARD"))
        self.assertIn("build the mapping again", message)
        client._save_refs(tessera.flatten_state(model.state_dict(), optimizer), None)

    def test_Load_StateSavedAbsent_EntryOfFqnKeyedStateDictDropped(self):
        # As get_optimizer_state_dict gives it (a number "count" written back as well).
        model_sd = {"w": torch.zeros(2), "v": torch.zeros(3)}
        osd = {"state": {"w": {"exp_avg": torch.ones(2), "count": 4},
                         "v": {"exp_avg": torch.ones(3), "count": 1}},
               "param_groups": [{"lr": 0.1, "params": ["w", "v"]}]}
        flat = tessera.flatten_state(model_sd, osd)
        stub_client(StubNative(absent_fqns={"v"})).load(5, into=flat)
        self.assertEqual(set(osd["state"]), {"w"})
        self.assertEqual(set(osd["state"]["w"]), {"exp_avg", "count"})

    def test_Load_StateSavedAbsent_SetOptimizerStateDictNonStrictLeavesItStateless(self):
        # The package's DTensor flow on one process: get_optimizer_state_dict makes up state
        # for every trainable parameter; after the load, set_optimizer_state_dict (strict=False,
        # as the example says) leaves the one saved without state stateless.
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
            set_optimizer_state_dict)
        model, optimizer = make()
        model_sd = get_model_state_dict(model)
        optim_sd = get_optimizer_state_dict(model, optimizer)
        stub_client(StubNative(absent_fqns={"fc2.bias"})).load(
            5, into=tessera.flatten_state(model_sd, optim_sd))
        set_optimizer_state_dict(model, optimizer, optim_sd,
                                 options=StateDictOptions(strict=False))
        params = dict(model.named_parameters())
        self.assertEqual(optimizer.state.get(params["fc2.bias"], {}), {})
        self.assertEqual(set(optimizer.state[params["fc2.weight"]]),
                         {"step", "exp_avg", "exp_avg_sq"})

    def test_Load_StateSavedAbsent_EntryOfIdKeyedStateDictDropped(self):
        model, optimizer = make()
        tessera.init_optimizer_state(optimizer)
        osd = optimizer.state_dict()
        flat = tessera.flatten_state(model.state_dict(), osd, param_names=PARAMS)
        stub_client(StubNative(absent_fqns={"norm.weight"})).load(5, into=flat)
        self.assertEqual(sorted(osd["state"]), [0, 1, 3, 4, 5])  # norm.weight is param id 2

    def test_Load_ObjectsOfRankNotSaved_InvalidArgumentNamingRank(self):
        client = stub_client(StubNative(absent_extras={client_module.HEADER_FQN}), rank=3)
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    "the checkpoint holds no objects for rank 3"):
            client.load(7, into={}, objects=True)

    def test_Load_FrozenParameterAbsentEntry_MessageSaysLeaveItOut(self):
        model, optimizer = make()
        model.fc2.bias.requires_grad_(False)
        tessera.init_optimizer_state(optimizer)
        flat = tessera.flatten_state(model.state_dict(), optimizer)
        client = stub_client(StubNative())
        with self.assertRaises(tessera.InvalidArgumentError) as ctx:
            client.load(5, into=flat)
        self.assertIn("requires_grad=False", ctx.exception.message)
        self.assertIn("'fc2.bias#'", ctx.exception.message)
        del flat["fc2.bias#"]  # what the message says to do
        self.assertEqual(client.load(5, into=flat), 5)


class ObjectsEncodingTest(unittest.TestCase):
    def roundtrip(self, value):
        return objects.decode(objects.encode(value))

    def test_Objects_NestedScalarsAndContainers_RoundTrip(self):
        value = {
            "ints": [0, -1, 2**70, True, False],
            "floats": [0.1, -0.0, 1e-300, 1.5e300, float("inf"), float("-inf")],
            "none": None,
            "text": "héllo \u2603 $not-a-tag",
            "bytes": b"\x00\xff\x10",
            "tuple": (1, (2, 3), []),
            "int_keys": {0: "a", 7: {"nested": (None,)}},
            "$dollar": {"$tensor": "looks like a tag"},
            "deep": {"a": {"b": {"c": [1, {"d": b""}]}}},
        }
        out = self.roundtrip(value)
        self.assertEqual(out["ints"], value["ints"])
        self.assertEqual([type(x) for x in out["ints"]], [int, int, int, bool, bool])
        self.assertEqual(out["floats"], value["floats"])
        self.assertEqual(math.copysign(1, out["floats"][1]), -1.0)
        self.assertEqual(out, value)
        self.assertTrue(math.isnan(self.roundtrip(float("nan"))))
        self.assertIsInstance(out["tuple"], tuple)
        self.assertIsInstance(out["bytes"], bytes)

    def test_Objects_RngStates_RoundTripAndRestore(self):
        states = {"torch": torch.get_rng_state(), "numpy": numpy.random.get_state(),
                  "python": random.getstate()}
        out = self.roundtrip(states)
        self.assertEqual(out["torch"].dtype, torch.uint8)
        self.assertTrue(torch.equal(out["torch"], states["torch"]))
        self.assertEqual(out["python"], states["python"])
        self.assertEqual(out["numpy"][0], "MT19937")
        self.assertTrue(numpy.array_equal(out["numpy"][1], states["numpy"][1]))
        expected = (torch.rand(5), numpy.random.rand(3), random.random())
        torch.set_rng_state(out["torch"])
        numpy.random.set_state(out["numpy"])
        random.setstate(out["python"])
        self.assertTrue(torch.equal(torch.rand(5), expected[0]))
        self.assertTrue(numpy.array_equal(numpy.random.rand(3), expected[1]))
        self.assertEqual(random.random(), expected[2])

    def test_Objects_TensorsAndArrays_RoundTripBitwise(self):
        values = [torch.tensor(3.5), torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
                  torch.zeros(0, 4), torch.tensor([True, False]), torch.arange(10)[::2],
                  torch.randn(3, dtype=torch.float64)]
        for t in values:
            out = self.roundtrip(t)
            self.assertEqual((out.dtype, out.shape), (t.dtype, t.shape))
            self.assertEqual(bits(out), bits(t))
        arr = numpy.arange(12, dtype=numpy.int16).reshape(3, 4).T
        out = self.roundtrip(arr)
        self.assertTrue(numpy.array_equal(out, arr))
        self.assertEqual(out.dtype, numpy.int16)
        scalar = self.roundtrip(numpy.int32(-7))
        self.assertEqual((scalar, scalar.dtype), (-7, numpy.int32))

    def test_Objects_OptimizerAndSchedulerState_RoundTrip(self):
        model, optimizer = make()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        one_step(model, optimizer)
        scheduler.step()
        value = {"param_groups": optimizer.state_dict()["param_groups"],
                 "scheduler": scheduler.state_dict()}
        out = self.roundtrip(value)
        self.assertEqual(out, value)
        fresh_model, fresh_optimizer = make(1)
        fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=9)
        fresh_scheduler.load_state_dict(out["scheduler"])
        self.assertEqual(fresh_scheduler.state_dict(), scheduler.state_dict())

    def test_Objects_Encoding_IsTaggedJson(self):
        data = objects.encode({"b": b"\x01"})
        self.assertTrue(data.startswith(b'{"format":"tessera.objects/1","value":'))
        self.assertIn(b'{"$bytes":"AQ=="}', data)

    def test_Objects_Unsupported_RefusedWithPath(self):
        with self.assertRaisesRegex(TypeError, r"sched\['lr_lambdas'\]\[0\].*function"):
            objects.encode({"lr_lambdas": [lambda e: e]}, "sched")
        with self.assertRaisesRegex(TypeError, "object"):
            objects.encode(numpy.array([object()]))
        with self.assertRaisesRegex(TypeError, "set"):
            objects.encode({1, 2})

    def test_Objects_DecodeForeignBytes_RefusedNeverUnpickled(self):
        import pickle
        for data in (pickle.dumps({"a": 1}), b'{"value": 1}', b'{"format":"other","value":1}',
                     b'{"format":"tessera.objects/1","value":{"$pickle":"gAR9"}}',
                     b'{"format":"tessera.objects/1","value":{"$bytes":"AQ==","x":1}}'):
            with self.assertRaises(ValueError, msg=data):
                objects.decode(data)


    def test_Objects_DecodeMalformedDocuments_ValueErrorOnly(self):
        # Found by tests/fuzz/objects_fuzzer.py: each of these escaped decode() as another
        # exception (TypeError, RecursionError, RuntimeError) instead of ValueError.
        doc = b'{"format":"tessera.objects/1","value":%s}'
        for value in (b'{"$ndarray":{"dtype":"<i6","shape":[],"data":"AwAAAAAAAAA="}}',
                      b'{"$tuple":5}', b'{"$dict":7}', b'{"$dict":[[[1],2]]}', b'{"$bytes":1}',
                      b'{"$tensor":{"dtype":"qint8","shape":[1],"data":"AA=="}}',
                      b'{"$tensor":{"dtype":"float32","shape":[-1],"data":""}}',
                      b'{"$tensor":{"dtype":"float32","shape":[null],"data":""}}',
                      b'{"$tensor":{"dtype":"float32","shape":[0,100000000000000000000],'
                      b'"data":""}}',
                      b'{"$ndarray":{"dtype":"<f4","shape":[0,100000000000000000000],'
                      b'"data":""}}',
                      b"[" * 100000 + b"]" * 100000):
            with self.assertRaises(ValueError, msg=value[:80]):
                objects.decode(doc % value)

    def test_Objects_DecodeHugeClaimedShape_RefusedBeforeAllocating(self):
        # 2^40 float32 elements (4 TiB) claimed for 4 bytes: refused by comparing the sizes,
        # never by trying to allocate the claim.
        data = (b'{"format":"tessera.objects/1","value":{"$tensor":{"dtype":"float32",'
                b'"shape":[1048576,1048576],"data":"AAAAAA=="}}}')
        with self.assertRaisesRegex(ValueError, r"4 bytes for a float32 tensor of shape "
                                                r"\[1048576, 1048576\] \(4398046511104 bytes\)"):
            objects.decode(data)

class RefusalTest(unittest.TestCase):
    def test_Step_LatestNewestAndBadValues(self):
        from tessera import client as client_module
        self.assertEqual(client_module._step("latest", allow_latest=True), -1)
        self.assertEqual(client_module._step("newest", allow_latest=True), -2)  # memory-only too
        self.assertEqual(client_module._step(7, allow_latest=False), 7)
        for bad in (-1, "newest", True, 1.5):
            with self.assertRaisesRegex(tessera.InvalidArgumentError, "step must be an int"):
                client_module._step(bad, allow_latest=False)

    def test_Ref_NonContiguousTensor_RefusedNamingKey(self):
        t = torch.zeros(3, 4).t()
        with self.assertRaises(tessera.InvalidArgumentError) as ctx:
            describe([("dp", 2)], {"layers.0.w": t})
        self.assertEqual(ctx.exception.code, "MALFORMED_SHARD")
        self.assertIn("layers.0.w", ctx.exception.message)
        self.assertIn("contiguous()", ctx.exception.message)
        self.assertIsInstance(ctx.exception, ValueError)
        describe([("dp", 2)], {"layers.0.w": t.contiguous()})  # the documented remedy

    def test_Ref_NonContiguousNumpy_Refused(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "C-contiguous"):
            describe([("dp", 2)], {"a": numpy.zeros((3, 4))[:, ::2]})

    def test_Ref_UnsupportedDtypes_Refused(self):
        for value in (torch.zeros(2, dtype=torch.complex64), numpy.zeros(2, dtype=numpy.complex128),
                      numpy.array(["x"])):
            with self.assertRaisesRegex(tessera.InvalidArgumentError, "dtype .* not store"):
                describe([("dp", 2)], {"a": value})

    def test_Ref_SupportedDtypes_Accepted(self):
        names = {}
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                      torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool):
            ref = describe([("dp", 2)], {"a": torch.zeros(3, dtype=dtype)})[0]
            names[str(dtype)] = ref[2]
            self.assertEqual(ref[11], 3 * torch.zeros(1, dtype=dtype).element_size())
        self.assertEqual(names["torch.bfloat16"], "BF16")
        self.assertEqual(names["torch.bool"], "BOOL")
        ref = describe([("dp", 2)], {"a": numpy.zeros((), dtype=numpy.uint16)})[0]
        self.assertEqual((ref[2], ref[3], ref[11]), ("U16", [], 2))

    def test_Ref_SparseMetaAndOtherTypes_Refused(self):
        for value, why in ((torch.zeros(2, 2).to_sparse(), "strided"),
                           (torch.empty(2, device="meta"), "device meta"),
                           ([1.0, 2.0], "list")):
            with self.assertRaisesRegex(tessera.InvalidArgumentError, why):
                describe([("dp", 2)], {"a": value})

    def test_Ref_LoadIntoReadOnlyOrAbsent_Refused(self):
        ro = numpy.zeros(3)
        ro.flags.writeable = False
        describe([("dp", 2)], {"a": ro})  # fine to save
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "read-only"):
            describe([("dp", 2)], {"a": ro}, for_load=True)
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "init_optimizer_state"):
            describe([("dp", 2)], {"w#": tessera.Absent((2,), torch.float32)}, for_load=True)

    def test_Ref_WrapperSubclass_RefusedNamingType(self):
        # Its data_ptr() is not its memory (here storage_offset * itemsize = 0x10, not null):
        # a copy from it would read address 0x10 and crash the trainer.
        class Float8Wrapper(torch.Tensor):
            @staticmethod
            def __new__(cls, inner):
                return torch.Tensor._make_wrapper_subclass(
                    cls, inner.shape, inner.stride(), inner.storage_offset(), dtype=inner.dtype,
                    device=inner.device)

            def __init__(self, inner):
                self.inner = inner

            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
                raise NotImplementedError(func)

        w = Float8Wrapper(torch.zeros(4, 4)[1:])
        self.assertEqual(w.data_ptr(), 0x10)
        for for_load in (False, True):
            with self.assertRaises(tessera.InvalidArgumentError) as ctx:
                describe([("dp", 2)], {"layers.0.w": w}, for_load)
            self.assertEqual(ctx.exception.code, "MALFORMED_SHARD")
            self.assertIn("layers.0.w", ctx.exception.message)
            self.assertIn("Float8Wrapper", ctx.exception.message)
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "Float8Wrapper"):
            tessera.Shard(w, (3, 4))
        describe([("dp", 2)], {"layers.0.w": w.inner})  # the remedy the message names
        describe([("dp", 2)], {"p": torch.nn.Parameter(torch.zeros(2))})  # not a wrapper

        class Tagged(torch.Tensor):  # no dispatch of its own: its storage is its data
            pass

        describe([("dp", 2)], {"t": torch.arange(4.)[1:].as_subclass(Tagged)})

    def test_Ref_CudaTensorRef_MarkedDevice(self):
        if not torch.cuda.is_available():
            self.skipTest("no GPU")
        ref = describe([("dp", 2)], {"a": torch.zeros(4, device="cuda")})[0]
        self.assertTrue(ref[12])

    def test_Client_NoAgent_ClearErrors(self):
        import os
        saved = os.environ.pop("TESSERA_AGENT", None)
        try:
            with self.assertRaisesRegex(tessera.InvalidArgumentError, "TESSERA_AGENT"):
                tessera.Client()
        finally:
            if saved is not None:
                os.environ["TESSERA_AGENT"] = saved
        with self.assertRaises(tessera.UnavailableError) as ctx:
            tessera.Client("/nonexistent/tessera-agent.sock", connect_timeout=5)
        self.assertEqual((ctx.exception.code, ctx.exception.status_code),
                         ("UNAVAILABLE", "UNAVAILABLE"))
        self.assertIsInstance(ctx.exception, ConnectionError)
        too_long = "/tmp/" + "d" * 100 + "/agent.sock"
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    r"agent socket path '%s' is 116 bytes; a unix socket path "
                                    r"holds at most 107" % too_long):
            tessera.Client("unix:" + too_long)

    def test_ObjectName_Reserved_Refused(self):
        from tessera.client import _check_object_name
        for name in ("", "a#b", "a@b", "tab\there", 3):
            with self.assertRaises(tessera.InvalidArgumentError, msg=repr(name)):
                _check_object_name(name)
        _check_object_name("rng.torch")


class DcpArgumentsTest(unittest.TestCase):
    """tessera.dcp's checks that need no agent: checkpoint ids, state dict shapes, arguments."""

    def test_Step_FromIntOrPathEndingInDigits(self):
        self.assertEqual(tessera_dcp._step_of(7), 7)
        self.assertEqual(tessera_dcp._step_of("/ckpt/run/step-120"), 120)
        self.assertEqual(tessera_dcp._step_of("ckpt/300/"), 300)

    def test_Step_NoNumber_MalformedNamingTheId(self):
        for bad in (None, True, "ckpt/latest", 1.5):
            with self.assertRaises(errors.InvalidArgumentError) as cm:
                tessera_dcp._step_of(bad)
            self.assertIn(repr(bad), cm.exception.message)

    def test_Walk_NestedTensorsValuesAndStateful(self):
        class Sched:
            def __init__(self):
                self.loaded = None

            def state_dict(self):
                return {"last_epoch": 3}

            def load_state_dict(self, sd):
                self.loaded = sd

        t = torch.zeros(2)
        walk = tessera_dcp._Walk({"model": {"a.w": t, "n": 1}, "sched": Sched(),
                                  "lst": [t, "x"]})
        self.assertEqual(sorted(walk.tensors), ["lst.0", "model.a.w"])
        self.assertEqual(walk.values, {"model.n": 1, "sched.last_epoch": 3, "lst.1": "x"})
        self.assertEqual(len(walk.statefuls), 1)

    def test_Walk_CollidingKeysAndNonStringKeys_Malformed(self):
        with self.assertRaises(errors.InvalidArgumentError) as cm:
            tessera_dcp._Walk({"a.b": 1, "a": {"b": 2}})
        self.assertIn("'a.b'", cm.exception.message)
        with self.assertRaises(errors.InvalidArgumentError):
            tessera_dcp._Walk({"a": {1: 2}})
        with self.assertRaises(errors.InvalidArgumentError):
            tessera_dcp._Walk([torch.zeros(1)])

    def test_StorageWriterOrPlanner_Refused(self):
        with self.assertRaises(errors.InvalidArgumentError) as cm:
            tessera_dcp.save({}, checkpoint_id=1, storage_writer=object())
        self.assertIn("storage_writer", cm.exception.message)
        with self.assertRaises(errors.InvalidArgumentError) as cm:
            tessera_dcp.load({}, checkpoint_id=1, planner=object())
        self.assertIn("planner", cm.exception.message)


class ShardTest(unittest.TestCase):
    def test_Shard_BoxOutsideGlobalShape_Refused(self):
        # The shard rules' words (common/shard_rules.h), through the native module.
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    r"Shard: box \[3:5, 0:3\] is outside the tensor on axis 0 "
                                    r"\(size 4\)"):
            tessera.Shard(torch.zeros(2, 3), (4, 3), offsets=(3, 0))

    def test_Shard_ShapeDiffersFromBox_Refused(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "differs from the box"):
            tessera.Shard(torch.zeros(6), (4, 3), local_shape=(2, 3))

    def test_Shard_OffsetsRank_Refused(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    "Shard: box has 1 offsets but 2 lengths"):
            tessera.Shard(torch.zeros(2, 3), (4, 3), offsets=(0,))

    def test_Shard_FlatRange_ElementCountAndBounds(self):
        s = tessera.Shard(torch.zeros(5), (4, 3), flat_range=(5, 10), kind="optimizer",
                          state_key="exp_avg")
        self.assertEqual(s.local_shape, (4, 3))
        ref = describe([("dp", 2)], {"w": s})[0]
        self.assertEqual((ref[6], ref[7]), ((5, 10), []))  # flat ranges are not dp replicas
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "holds 5 elements"):
            tessera.Shard(torch.zeros(4), (4, 3), flat_range=(5, 10))
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    r"Shard: flat range \[10, 15\) is not within the 12 elements"):
            tessera.Shard(torch.zeros(5), (4, 3), flat_range=(10, 15))
        with self.assertRaisesRegex(tessera.InvalidArgumentError, r"flat range \[5, 4\) is not within"):
            tessera.Shard(torch.zeros(0), (4, 3), flat_range=(5, 4))

    def test_Shard_KindAndStateKey_Checked(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "'param' or 'optimizer'"):
            tessera.Shard(torch.zeros(1), (1,), kind="extra")
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "only kind='optimizer'"):
            tessera.Shard(torch.zeros(1), (1,), state_key="exp_avg")
        opt = tessera.Shard(torch.zeros(1), (1,), kind="optimizer")
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "needs a state_key"):
            describe([("dp", 2)], {"w": opt})
        ref = describe([("dp", 2)], {"w#exp_avg": opt})[0]
        self.assertEqual((ref[0], ref[1], ref[8]), ("w", shards.KIND_OPTIMIZER, "exp_avg"))
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "says 'm'"):
            describe([("dp", 2)], {"w#exp_avg": tessera.Shard(torch.zeros(1), (1,),
                                                               kind="optimizer", state_key="m")})

    def test_Shard_ZeroDim_EmptyBox(self):
        s = tessera.Shard(torch.tensor(2.0), ())
        ref = describe([("dp", 2)], {"scale": s})[0]
        self.assertEqual((ref[3], ref[4], ref[5], ref[11]), ([], [], [], 4))

    def test_Shard_ReplicatedOverDefault_DependsOnMesh(self):
        t = torch.zeros(2)
        self.assertEqual(describe([("dp", 2)], {"a": t})[0][7], ["dp"])
        self.assertEqual(describe([("pp", 2), ("tp", 2)], {"a": t})[0][7], [])
        self.assertEqual(describe([("dp", 2)], {"a#m": t})[0][7], ["dp"])
        tp = tessera.Shard(t, (4,), offsets=(2,), replicated_over="tp")
        self.assertEqual(describe([("tp", 2)], {"a": tp})[0][7], ["tp"])
        everywhere = tessera.Shard(t, (2,), replicated_over=shards.ALL_DIMS)
        self.assertEqual(describe([("pp", 2), ("tp", 2)], {"a": everywhere})[0][7], ["pp", "tp"])

    def test_Native_ReplicatedOverUnknownDim_MalformedShard(self):
        s = tessera.Shard(torch.zeros(2), (2,), replicated_over=["cp"])
        with self.assertRaises(tessera.InvalidArgumentError) as ctx:
            describe([("dp", 2)], {"layers.1.w": s})
        self.assertEqual(ctx.exception.code, "MALFORMED_SHARD")
        self.assertEqual(ctx.exception.status_code, "INVALID_ARGUMENT")
        self.assertEqual(ctx.exception.fqns, ["layers.1.w"])
        self.assertIn('"cp"', ctx.exception.message)

    def test_Absent_Like_CopiesBoxOfShard(self):
        s = tessera.Shard(torch.zeros(2, 3, dtype=torch.bfloat16), (4, 3), offsets=(2, 0),
                          replicated_over=[])
        a = tessera.Absent.like(s)
        self.assertEqual((a.global_shape, a.offsets, a.local_shape, a.dtype, a.replicated_over),
                         ((4, 3), (2, 0), (2, 3), "BF16", ()))
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "without a state key"):
            describe([("dp", 2)], {"w#exp_avg": a})


class MalformedNameAndShapeTest(unittest.TestCase):
    """Inputs Python can carry but the wire cannot: a clear MALFORMED_SHARD before any RPC,
    never pybind11's "Unable to cast Python instance to C++ type"."""

    def test_Ref_FqnWithLoneSurrogate_MalformedNamingIt(self):
        fqn = b"layers.\xff.weight".decode("utf-8", "surrogateescape")  # as os.fsdecode gives
        with self.assertRaises(tessera.InvalidArgumentError) as ctx:
            describe([("dp", 2)], {fqn: torch.zeros(2)})
        self.assertEqual(ctx.exception.code, "MALFORMED_SHARD")
        self.assertIn("not valid UTF-8", ctx.exception.message)
        self.assertIn("layers.\\udcff.weight", ctx.exception.message)
        self.assertEqual(ctx.exception.fqns, ["layers.\\udcff.weight"])
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "state_key .*not valid UTF-8"):
            describe([("dp", 2)], {"w#exp\udcc3": torch.zeros(2)})
        from tessera.client import _check_object_name
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "object name .*UTF-8"):
            _check_object_name("rng\udcff")

    def test_Ref_FqnNotUtf8OrReserved_NativeCheckNamesIt(self):
        for key, why in (("", "bad fqn: name is empty"),
                         ("layers.0\n.w", "control character"),
                         ("layers@0", "reserved character '@'")):
            with self.assertRaises(tessera.InvalidArgumentError, msg=repr(key)) as ctx:
                describe([("dp", 2)], {key: torch.zeros(2)})
            self.assertEqual(ctx.exception.code, "MALFORMED_SHARD")
            self.assertIn(why, ctx.exception.message)

    def test_Shard_DimOutsideInt64_Malformed(self):
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    r"global_shape\[0\] = 18446744073709551616 does not fit"):
            tessera.Shard(torch.zeros(1), (1 << 64,), local_shape=(1,))
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "must not be negative"):
            tessera.Shard(torch.zeros(1), (-4, 8), local_shape=(1, 1))

    def test_Shard_VolumeOverflowAndTooManyAxes_RefusedAtConstruction(self):
        # The shard rules (common/shard_rules.h) run when the Shard is made, so the mistake is
        # raised on the line that made it, before any save.
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    r"Shard: element count of \[1099511627776, 1099511627776\] "
                                    "overflows int64"):
            tessera.Shard(torch.zeros(1, 1), (1 << 40, 1 << 40))
        with self.assertRaisesRegex(tessera.InvalidArgumentError,
                                    "Shard: the tensor has 65 axes; at most 64 are supported"):
            tessera.Shard(torch.zeros(1), (1,) * 65, flat_range=(0, 1))


class ErrorMappingTest(unittest.TestCase):
    def test_FromStatus_ChoosesSubclassByStatusCode(self):
        e = errors.from_status("DUPLICATE_FQN", "INVALID_ARGUMENT", "two stages name w",
                               {"fqns": ["w"], "ranks": [(0, "pp=0"), (1, "pp=1")],
                                "state_key": "", "path": ""})
        self.assertIsInstance(e, tessera.InvalidArgumentError)
        self.assertEqual((e.code, e.message, e.fqns, e.ranks),
                         ("DUPLICATE_FQN", "two stages name w", ["w"], [(0, "pp=0"), (1, "pp=1")]))
        cases = {"ABORTED": tessera.AbortedError, "NOT_FOUND": tessera.NotFoundError,
                 "DATA_LOSS": tessera.DataLossError, "UNAVAILABLE": tessera.UnavailableError,
                 "DEADLINE_EXCEEDED": tessera.DeadlineExceededError,
                 "FAILED_PRECONDITION": tessera.FailedPreconditionError,
                 "RESOURCE_EXHAUSTED": tessera.ResourceExhaustedError,
                 "INTERNAL": tessera.InternalError}
        for status, cls in cases.items():
            e = errors.from_status("UNSPECIFIED", status, "m", None)
            self.assertIs(type(e), cls)
            self.assertEqual(e.code, status)  # no ErrorCode: the status name
        self.assertIs(type(errors.from_status("UNSPECIFIED", "UNKNOWN", "m")), tessera.TesseraError)


class ObjectsHeaderTest(unittest.TestCase):
    def test_Padded_SizeClasses_StableAndDecodable(self):
        from tessera.client import padded
        self.assertEqual([len(padded(b"x" * n)) for n in (0, 1, 100, 512, 513, 5000, 70000)],
                         [0, 512, 512, 512, 1024, 5120, 81920])
        # A learning rate printed with more digits keeps the size (and so the cached plan).
        a = objects.encode({"lr": 0.005, "last_lr": [0.005]})
        b = objects.encode({"lr": 0.0025, "last_lr": [0.0025]})
        self.assertNotEqual(len(a), len(b))
        self.assertEqual(len(padded(a)), len(padded(b)))
        self.assertEqual(objects.decode(padded(b)), {"lr": 0.0025, "last_lr": [0.0025]})

    def test_Header_IsLittleEndianLength(self):
        from tessera.client import _Buffer
        buf = _Buffer(struct.pack("<Q", 300))
        ref = buf.ref("tessera.objects.header")
        self.assertEqual((ref[1], ref[2], ref[3], ref[11]), (shards.KIND_EXTRA, "U8", [8], 8))
        _tessera.describe([("dp", 2)], [ref])


if __name__ == "__main__":
    testlib.main()
