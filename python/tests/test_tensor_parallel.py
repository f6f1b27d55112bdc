"""Tensor-parallel shards against a real daemon: shard keys give torch.tensor_split's slices for
every dtype, dimension and count; bad specs are refused; two rank processes load their halves of a
Llama layer, and of a Phi-3-style layer (fused qkv and gate_up split segment by segment, row-parallel
biases whole), with load_shards and their all-reduced forward equals the whole layer's."""

import json
import os

import torch

import tierd
from dit_model import save_safetensors
from tierd import tensor_parallel
from tierd_testing import DaemonTestCase, TIMEOUT, run_python, torch_device
from tp_layers import PLAN, PREFIX, RANK_SOURCE, example_input, reference_layer

_TENSORS = {
    "f32": torch.randn(7, 6),
    "bf16": torch.randn(6, 10).to(torch.bfloat16),
    "f16": torch.randn(5, 4, 3).to(torch.float16),
    "u8": torch.randint(0, 255, (3, 5, 2, 4), dtype=torch.uint8),
    "i64": torch.randint(-1000, 1000, (4, 9)),
    "f64": torch.randn(9).double(),
}


class ShardKeyTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        save_safetensors(_TENSORS, os.path.join(self.model_dir("t"), "model.safetensors"))
        self.client.register_model("t", self.model_dir("t"), grouping="tensor")

    def test_shards_are_tensor_split_for_every_dtype_dim_and_count(self):
        checked = 0
        with self.client.session() as session:
            for name, whole in _TENSORS.items():
                for dim in range(whole.dim()):
                    for count in sorted({1, 2, 3, whole.shape[dim]}):
                        if count > whole.shape[dim]:
                            continue
                        expected = torch.tensor_split(whole, count, dim)
                        for index in range(count):
                            key = tensor_parallel.shard_key(f"t/{name}", dim, index, count)
                            with session.fetch(key) as lease:
                                got = lease.tensor.cpu()
                            self.assertEqual(got.dtype, whole.dtype, key)
                            self.assertTrue(torch.equal(got, expected[index]), key)
                            checked += 1
        self.assertGreater(checked, 60)

    def test_bad_specs_are_refused(self):
        with self.client.session() as session:
            for key in ("t/f32@2:0/2", "t/f64@1:0/1", "t/f32@0:2/2", "t/f32@0:0/0",
                        "t/f32@1:0/7", "t/f32@0:1", "t/f32@0:01/2"):
                with self.assertRaises(tierd.TierdError, msg=key) as raised:
                    session.fetch(key)
                self.assertEqual(raised.exception.code, tierd.StatusCode.INVALID_ARGUMENT, key)
        for dim, index, count in ((0, 2, 2), (-1, 0, 2), (0, 0, 0), (True, 0, 1)):
            with self.assertRaises(ValueError):
                tensor_parallel.shard_key("t/f32", dim, index, count)

    def test_a_tied_parameter_is_fetched_once_and_tied_again(self):
        class Tied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(7, 6, device="meta")
                self.head = torch.nn.Linear(6, 7, bias=False, device="meta")
                self.head.weight = self.embed.weight

        embedding = torch.randn(7, 6)
        save_safetensors({"embed.weight": embedding},
                         os.path.join(self.model_dir("tied"), "model.safetensors"))
        self.client.register_model("tied", self.model_dir("tied"), grouping="tensor")
        module = Tied()
        keys = tensor_parallel.load_shards(module, self.client, "tied", {"embed": 0}, 1, 2)
        self.assertEqual(keys, {"embed.weight": "tied/embed.weight@0:1/2"})
        self.assertIs(module.head.weight, module.embed.weight)
        self.assertTrue(torch.equal(module.embed.weight.detach().cpu(),
                                    torch.tensor_split(embedding, 2, 0)[1]))

    def test_a_rowwise_linears_bias_comes_whole(self):
        # Row parallelism splits the weight's input dimension; the bias, added once after the
        # all-reduce, is every rank's whole (it has no dimension 1 to split).
        weight, bias = torch.randn(5, 8), torch.randn(5)
        save_safetensors({"proj.weight": weight, "proj.bias": bias},
                         os.path.join(self.model_dir("rowwise"), "model.safetensors"))
        self.client.register_model("rowwise", self.model_dir("rowwise"), grouping="tensor")

        class Row(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(4, 5, bias=True, device="meta")

        module = Row()
        keys = tensor_parallel.load_shards(module, self.client, "rowwise", {"proj": "rowwise"},
                                           1, 2)
        self.assertEqual(keys, {"proj.weight": "rowwise/proj.weight@1:1/2",
                                "proj.bias": "rowwise/proj.bias"})
        self.assertTrue(torch.equal(module.proj.weight.detach().cpu(),
                                    torch.tensor_split(weight, 2, 1)[1]))
        self.assertTrue(torch.equal(module.proj.bias.detach().cpu(), bias))

    def test_a_plan_names_a_fused_parameters_segments(self):
        plan = {"*.qkv_proj": ("colwise", (64, 32, 32)), "*.o_proj": ("rowwise", None),
                "*.gate_up_proj": (0, [96, 96])}
        self.assertEqual(tensor_parallel.split_spec(plan, "l.qkv_proj.weight"), (0, [64, 32, 32]))
        self.assertEqual(tensor_parallel.split_spec(plan, "l.gate_up_proj.bias"), (0, [96, 96]))
        self.assertEqual(tensor_parallel.split_spec(plan, "l.o_proj.weight"), (1, None))
        self.assertEqual(tensor_parallel.split_spec(plan, "l.norm.weight"), (None, None))
        self.assertEqual(tensor_parallel.shard_key("m/x", 0, 1, 2, (64, 32, 32)),
                         "m/x@0:1/2:64,32,32")
        for bad in ((64,), (64, -1), ("a", 2)):
            with self.assertRaises(ValueError):
                tensor_parallel.shard_key("m/x", 0, 1, 2, bad)
            with self.assertRaises(ValueError):
                tensor_parallel.split_spec({"*": ("colwise", bad)}, "x.weight")

    def test_a_plan_names_each_parameters_dimension(self):
        plan = {"*.q_proj": "colwise", "*.o_proj": "rowwise", "*.norm.weight": None,
                "embed.weight": 1}
        self.assertEqual(tensor_parallel.split_dim(plan, "layers.0.q_proj.weight"), 0)
        self.assertEqual(tensor_parallel.split_dim(plan, "layers.0.o_proj.bias"), 1)
        self.assertIsNone(tensor_parallel.split_dim(plan, "layers.0.norm.weight"))
        self.assertIsNone(tensor_parallel.split_dim(plan, "lm_head.weight"))
        self.assertEqual(tensor_parallel.split_dim(plan, "embed.weight"), 1)
        with self.assertRaises(ValueError):
            tensor_parallel.split_dim({"*": "diagonal"}, "x.weight")


class TwoRanksTest(DaemonTestCase):
    def run_two_ranks(self, kind):
        """Saves the `kind` layer of tp_layers as model `kind`, runs two rank processes on it and
        checks rank 0's all-reduced output against the whole layer's. Returns (the layer's
        state as saved, each rank's {parameter: [key, shape]})."""
        reference = reference_layer(kind=kind)
        state = {PREFIX + name: tensor for name, tensor in reference.state_dict().items()}
        save_safetensors(state, os.path.join(self.model_dir(kind), "model.safetensors"))
        self.client.register_model(kind, self.model_dir(kind), grouping="tensor")
        out = os.path.join(self.directory, "y.pt")
        rendezvous = os.path.join(self.directory, "rendezvous")
        ranks = [run_python(RANK_SOURCE, self.daemon.socket, str(rank), "2", rendezvous, out,
                            kind) for rank in range(2)]
        reports = []
        for rank in ranks:
            stdout, stderr = rank.communicate(timeout=TIMEOUT)
            self.assertEqual(rank.returncode, 0, stderr)
            reports.append(json.loads(stdout.strip().splitlines()[-1])["parameters"])
        with torch.no_grad():
            expected = reference(example_input())
        torch.testing.assert_close(torch.load(out), expected, rtol=1e-5, atol=1e-5)
        return state, reports

    def test_two_ranks_halves_compute_the_whole_layers_forward(self):
        state, reports = self.run_two_ranks("llama")
        # Each rank held half of each projection and the whole of each norm.
        for rank, report in enumerate(reports):
            key, shape = report["self_attn.q_proj.weight"]
            self.assertEqual(key, f"llama/{PREFIX}self_attn.q_proj.weight@0:{rank}/2")
            self.assertEqual(shape, [32, 64])
            key, shape = report["mlp.down_proj.weight"]
            self.assertEqual(key, f"llama/{PREFIX}mlp.down_proj.weight@1:{rank}/2")
            self.assertEqual(shape, [64, 48])
            key, shape = report["input_layernorm.weight"]
            self.assertEqual(key, f"llama/{PREFIX}input_layernorm.weight")
            self.assertEqual(shape, [64])
        # The node read each byte once: the ranks' shards add up to the layer, norms read once.
        layer_bytes = sum(t.numel() * t.element_size() for t in state.values())
        self.assertEqual(self.client.stats().bytes_disk_to_host, layer_bytes)

    def test_two_ranks_of_a_layer_with_fused_projections_and_biases(self):
        # Phi-3's layout: q, k and v in one qkv_proj, gate and up in one gate_up_proj, each split
        # segment by segment; the row-parallel o and down come with biases, whole on each rank.
        state, reports = self.run_two_ranks("phi3")
        for rank, report in enumerate(reports):
            for name, key, shape in (
                    ("self_attn.qkv_proj.weight", f"@0:{rank}/2:64,32,32", [64, 64]),
                    ("self_attn.qkv_proj.bias", f"@0:{rank}/2:64,32,32", [64]),
                    ("mlp.gate_up_proj.weight", f"@0:{rank}/2:96,96", [96, 64]),
                    ("self_attn.o_proj.weight", f"@1:{rank}/2", [64, 32]),
                    ("self_attn.o_proj.bias", "", [64]),
                    ("mlp.down_proj.bias", "", [64])):
                self.assertEqual(report[name], [f"phi3/{PREFIX}{name}{key}", shape], name)
        # Each rank's fused q|k|v rows are its slices of q, k and v, together.
        whole = state[PREFIX + "self_attn.qkv_proj.weight"]
        q, k, v = whole.split([64, 32, 32])
        with self.client.session() as session:
            with session.fetch(f"phi3/{PREFIX}self_attn.qkv_proj.weight@0:1/2:64,32,32") as lease:
                rows = lease.tensors[PREFIX + "self_attn.qkv_proj.weight"].cpu()
        self.assertTrue(torch.equal(rows, torch.cat([q[32:], k[16:], v[16:]])))
        # Each byte read once for the node: the ranks' slices add up to the layer.
        layer_bytes = sum(t.numel() * t.element_size() for t in state.values())
        self.assertEqual(self.client.stats().bytes_disk_to_host, layer_bytes)

    def test_a_module_of_the_wrong_shape_is_refused(self):
        reference = reference_layer()
        state = {PREFIX + name: tensor for name, tensor in reference.state_dict().items()}
        save_safetensors(state, os.path.join(self.model_dir("llama"), "model.safetensors"))
        self.client.register_model("llama", self.model_dir("llama"), grouping="tensor")
        whole = reference_layer(seed=3).to(torch_device())
        with self.assertRaisesRegex(ValueError, "q_proj.weight has shape"):
            tensor_parallel.load_shards(whole, self.client, "llama", PLAN, 0, 2, prefix=PREFIX)
        # Whole (a plan splitting nothing), it loads the reference's weights.
        tensor_parallel.load_shards(whole, self.client, "llama", {}, 0, 1, prefix=PREFIX)
        for name, parameter in whole.named_parameters():
            self.assertTrue(torch.equal(parameter.cpu(), reference.state_dict()[name]), name)
