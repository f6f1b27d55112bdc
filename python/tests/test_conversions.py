"""tierd.conversions: checkpoint conversions served as bytes. What each operation does to the bytes
is checked against torch itself (stack, cat, chunk on tensors of element numbers, zero-size ones
among them); then checkpoints of per-expert tensors, written as Mixtral and Qwen-MoE checkpoints
store them, are registered with the fused parameters transformers would build, and a real
daemon's objects — whole and one expert at a time — are compared with torch.stack and torch.cat
of the checkpoint's tensors. The transforms here stand in for transformers' (which CI lacks):
they match keys the way transformers' rename_source_key() does, and the GPU machine's tests run
the same code on transformers' own mapping."""

import os
import random
import re
import unittest

import torch

import tierd
from tierd import conversions
from tierd.errors import TierdError
from dit_model import save_safetensors
from tierd_testing import DaemonTestCase


# ---- stand-ins for transformers' conversion mapping (named as transformers names them) ---------

class _Transform:
    def __init__(self, source_patterns, target_patterns, operations=()):
        self.source_patterns = [source_patterns] if isinstance(source_patterns, str) else source_patterns
        self.target_patterns = [target_patterns] if isinstance(target_patterns, str) else target_patterns
        self.operations = list(operations)

    def rename_source_key(self, key):
        for pattern in self.source_patterns:
            match = re.search(pattern.replace(".", r"\.").replace("*", r"\d+"), key)
            if match:
                return key.replace(match.group(0), self.target_patterns[0], 1), pattern
        return key, None


class WeightRenaming(_Transform):
    pass


class WeightConverter(_Transform):
    pass


class MergeModulelist:
    def __init__(self, dim=0):
        self.dim = dim


class Concatenate:
    def __init__(self, dim=0):
        self.dim = dim


class Chunk:
    def __init__(self, dim=0, chunks=None):
        self.dim = dim
        self.chunks = chunks


class Transpose:
    def __init__(self, dim0=0, dim1=1):
        self.dim0, self.dim1 = dim0, dim1


# transformers' mapping for Mixtral and for the Qwen2-MoE family, as its conversion_mapping
# states them.
MIXTRAL = [
    WeightRenaming(".block_sparse_moe.gate", ".mlp.gate"),
    WeightConverter(["block_sparse_moe.experts.*.w1.weight", "block_sparse_moe.experts.*.w3.weight"],
                    "mlp.experts.gate_up_proj", [MergeModulelist(dim=0), Concatenate(dim=1)]),
    WeightConverter("block_sparse_moe.experts.*.w2.weight", "mlp.experts.down_proj",
                    [MergeModulelist(dim=0)]),
]
QWEN2_MOE = [
    WeightConverter(["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"],
                    "mlp.experts.gate_up_proj", [MergeModulelist(dim=0), Concatenate(dim=1)]),
    WeightConverter("mlp.experts.*.down_proj.weight", "mlp.experts.down_proj",
                    [MergeModulelist(dim=0)]),
]


def _elements(shape, start):
    count = 1
    for dim in shape:
        count *= dim
    return torch.arange(start, start + count, dtype=torch.int64).reshape(shape)


def _materialize(tensor, sources):
    """The int64 tensor a derived tensor's ranges make of `sources`' bytes."""
    flat = [sources[name].reshape(-1)[offset // 8:(offset + length) // 8]
            for name, offset, length in tensor.ranges()]
    joined = torch.cat(flat) if flat else torch.empty(0, dtype=torch.int64)
    return joined.reshape(tensor.shape)


class BytesTest(unittest.TestCase):
    """Each operation's ranges against torch's own result, on tensors of element numbers."""

    def test_stack_cat_and_chunk_move_the_bytes_torch_moves(self):
        rng = random.Random(7)
        for trial in range(400):
            rank = rng.randint(1, 4)
            shape = [rng.randint(0 if trial % 9 == 0 else 1, 4) for _ in range(rank)]
            names = [f"t{i}" for i in range(rng.randint(1, 4))]
            sources = {}
            start = 0
            for name in names:
                sources[name] = _elements(shape, start)
                start += sources[name].numel()
            symbolic = [conversions._Bytes.of(name, shape, 8) for name in names]
            context = f"trial {trial}: shape {shape}"

            dim = rng.randint(-rank, rank - 1)
            self.assertTrue(torch.equal(
                _materialize(conversions._cat(symbolic, dim), sources),
                torch.cat([sources[n] for n in names], dim=dim)), f"{context} cat({dim})")
            dim = rng.randint(-(rank + 1), rank)
            stacked = conversions._stack(symbolic, dim)
            expected = torch.stack([sources[n] for n in names], dim=dim)
            self.assertTrue(torch.equal(_materialize(stacked, sources), expected),
                            f"{context} stack({dim})")
            # Stacked, then concatenated with itself along any dimension (experts' gate and up).
            again = rng.randint(0, rank)
            self.assertTrue(torch.equal(
                _materialize(conversions._cat([stacked, stacked], again), sources),
                torch.cat([expected, expected], dim=again)), f"{context} cat of stacks({again})")
            dim = rng.randint(0, rank - 1)
            if shape[dim] == 0:
                continue
            chunks = rng.randint(1, 4)
            pieces = conversions._split(symbolic[0], conversions._chunk_sizes(shape[dim], chunks), dim)
            expected = torch.chunk(sources[names[0]], chunks, dim=dim)
            self.assertEqual(len(pieces), len(expected), context)
            for piece, reference in zip(pieces, expected):
                self.assertTrue(torch.equal(_materialize(piece, sources), reference),
                                f"{context} chunk({chunks}, {dim})")

    def test_a_chunk_of_an_empty_dimension_makes_as_many_empty_tensors_as_torch(self):
        source = _elements((3, 0, 1), 0)
        pieces = conversions._split(conversions._Bytes.of("t", (3, 0, 1), 8),
                                    conversions._chunk_sizes(0, 3), 1)
        expected = torch.chunk(source, 3, dim=1)
        self.assertEqual(len(pieces), len(expected))
        for piece, reference in zip(pieces, expected):
            self.assertEqual(piece.shape, tuple(reference.shape))

    def test_a_conversion_that_changes_layout_is_refused_by_parameter_and_operation(self):
        checkpoint = {"layers.0.w.weight": ("BF16", (4, 8))}
        transpose = [WeightConverter("w.weight", "w_t.weight", [Transpose(0, 1)])]
        with self.assertRaises(ValueError) as caught:
            conversions.derived_tensors(checkpoint, transpose)
        self.assertIn("layers.0.w_t.weight", str(caught.exception))
        self.assertIn("Transpose", str(caught.exception))

    def test_sources_of_two_dtypes_are_refused(self):
        checkpoint = {"mlp.experts.0.gate_proj.weight": ("BF16", (2, 4)),
                      "mlp.experts.0.up_proj.weight": ("F32", (2, 4))}
        with self.assertRaises(ValueError) as caught:
            conversions.derived_tensors(checkpoint, QWEN2_MOE[:1])
        self.assertIn("mlp.experts.gate_up_proj", str(caught.exception))
        self.assertIn("change values", str(caught.exception))

    def test_experts_are_collected_in_numeric_order(self):
        checkpoint = {f"mlp.experts.{e}.down_proj.weight": ("F16", (2, 3)) for e in range(12)}
        (message,) = conversions.derived_tensors(checkpoint, QWEN2_MOE[1:])
        self.assertEqual(message.name, "mlp.experts.down_proj")
        self.assertEqual(list(message.shape), [12, 2, 3])
        self.assertEqual([r.tensor for r in message.ranges],
                         [f"mlp.experts.{e}.down_proj.weight" for e in range(12)])


def transformers_rename_source_key(key, renamings, converters, prefix=None, meta_state_dict=None):
    """transformers.core_model_loading.rename_source_key's steps: every renaming, then the first
    converter that matches, then the base model prefix added or stripped."""
    for renaming in renamings:
        key, _ = renaming.rename_source_key(key)
    pattern = None
    for converter in converters:
        key, pattern = converter.rename_source_key(key)
        if pattern is not None:
            break
    if prefix and meta_state_dict is not None:
        if key.startswith(prefix + ".") and key[len(prefix) + 1:] in meta_state_dict:
            key = key[len(prefix) + 1:]
        elif f"{prefix}.{key}" in meta_state_dict:
            key = f"{prefix}.{key}"
    return key, pattern


class RenameTest(unittest.TestCase):
    """transformers' own rename_source_key, where given, decides each key's name and converter."""

    CHECKPOINT = {
        "layers.0.block_sparse_moe.gate.weight": ("BF16", (4, 8)),
        "layers.0.block_sparse_moe.experts.0.w1.weight": ("BF16", (6, 8)),
        "layers.0.block_sparse_moe.experts.0.w3.weight": ("BF16", (6, 8)),
        "layers.0.block_sparse_moe.experts.0.w2.weight": ("BF16", (8, 6)),
        "layers.0.block_sparse_moe.experts.1.w1.weight": ("BF16", (6, 8)),
        "layers.0.block_sparse_moe.experts.1.w3.weight": ("BF16", (6, 8)),
        "layers.0.block_sparse_moe.experts.1.w2.weight": ("BF16", (8, 6)),
    }
    # The model's keys carry the base model's prefix the checkpoint's lack (a base model's
    # checkpoint loaded into a ForCausalLM).
    MODEL_KEYS = ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                  "model.layers.0.mlp.experts.down_proj"]

    def test_transformers_renaming_and_the_same_steps_here_agree(self):
        theirs = conversions.derived_tensors(self.CHECKPOINT, MIXTRAL, self.MODEL_KEYS, "model",
                                             rename_source_key=transformers_rename_source_key)
        ours = conversions.derived_tensors(self.CHECKPOINT, MIXTRAL, self.MODEL_KEYS, "model")
        self.assertEqual(theirs, ours)
        self.assertEqual(sorted(m.name for m in theirs), sorted(self.MODEL_KEYS))
        fused = next(m for m in theirs if m.name.endswith("gate_up_proj"))
        self.assertEqual(list(fused.shape), [2, 12, 8])
        self.assertEqual([r.tensor.split(".")[-2:] for r in fused.ranges],
                         [["w1", "weight"], ["w3", "weight"]] * 2)


class ServedConversionTest(DaemonTestCase):
    """Fused parameters served by a real daemon, compared with torch.stack / torch.cat."""

    def write_moe(self, name, layers, experts, naming, hidden=16, intermediate=12,
                  dtype=torch.bfloat16):
        """A checkpoint of per-expert tensors in two files; returns {name: tensor}."""
        generator = torch.Generator().manual_seed(len(name) + experts)
        tensors = {}
        for layer in range(layers):
            for e in range(experts):
                for projection, shape in naming(layer, e, hidden, intermediate):
                    tensors[projection] = torch.randn(shape, generator=generator).to(dtype)
            tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = torch.randn(
                hidden, hidden, generator=generator).to(dtype)
        directory = self.model_dir(name)
        names = sorted(tensors)
        half = len(names) // 2
        save_safetensors({n: tensors[n] for n in names[:half]},
                         os.path.join(directory, "model-00001-of-00002.safetensors"))
        save_safetensors({n: tensors[n] for n in names[half:]},
                         os.path.join(directory, "model-00002-of-00002.safetensors"))
        return directory, tensors

    @staticmethod
    def qwen_names(layer, e, hidden, intermediate):
        prefix = f"model.layers.{layer}.mlp.experts.{e}"
        return [(f"{prefix}.gate_proj.weight", (intermediate, hidden)),
                (f"{prefix}.up_proj.weight", (intermediate, hidden)),
                (f"{prefix}.down_proj.weight", (hidden, intermediate))]

    @staticmethod
    def mixtral_names(layer, e, hidden, intermediate):
        prefix = f"model.layers.{layer}.block_sparse_moe.experts.{e}"
        names = [(f"{prefix}.w1.weight", (intermediate, hidden)),
                 (f"{prefix}.w3.weight", (intermediate, hidden)),
                 (f"{prefix}.w2.weight", (hidden, intermediate))]
        if e == 0:
            names.append((f"model.layers.{layer}.block_sparse_moe.gate.weight", (4, hidden)))
        return names

    def fetch(self, session, key, name):
        with session.fetch(key) as lease:
            return lease.tensors[name].cpu().clone()

    def check(self, model, directory, tensors, transforms, layers, experts, gate, up, down,
              grouping="tensor"):
        derived = conversions.derived_tensors(conversions.read_checkpoint_index(directory),
                                              transforms)
        summary = self.client.register_model(model, directory, grouping=grouping, derived=derived)
        self.assertEqual(summary.derived_tensors, len(derived))
        with self.client.session() as session:
            # Read into the host tier ahead, as a streamed model's blocks are (stream_weights'
            # host_read_ahead): derived tensors and the objects holding them are asked like any.
            keys = [info.key for info in self.client.list_objects(model)]
            self.assertEqual(session.prefetch(keys, host_only=True), len(keys))
            for layer in range(layers):
                fused = f"model.layers.{layer}.mlp.experts"
                gates = [tensors[gate.format(layer=layer, e=e)] for e in range(experts)]
                ups = [tensors[up.format(layer=layer, e=e)] for e in range(experts)]
                downs = [tensors[down.format(layer=layer, e=e)] for e in range(experts)]
                expected = torch.cat([torch.stack(gates), torch.stack(ups)], dim=1)
                key = f"{model}/{fused}.gate_up_proj" if grouping == "tensor" else \
                    f"{model}/model.layers.{layer}"
                self.assertTrue(torch.equal(self.fetch(session, key, f"{fused}.gate_up_proj"),
                                            expected), f"layer {layer} gate_up_proj")
                key = f"{model}/{fused}.down_proj" if grouping == "tensor" else key
                self.assertTrue(torch.equal(self.fetch(session, key, f"{fused}.down_proj"),
                                            torch.stack(downs)), f"layer {layer} down_proj")
                if grouping != "tensor":
                    continue
                # Each expert alone: a shard of the fused parameter along its first dimension.
                for e in range(experts):
                    shard = f"@0:{e}/{experts}"
                    self.assertTrue(torch.equal(
                        self.fetch(session, f"{model}/{fused}.gate_up_proj{shard}",
                                   f"{fused}.gate_up_proj"),
                        torch.cat([gates[e], ups[e]]).unsqueeze(0)), f"layer {layer} expert {e}")
                    self.assertTrue(torch.equal(
                        self.fetch(session, f"{model}/{fused}.down_proj{shard}", f"{fused}.down_proj"),
                        downs[e].unsqueeze(0)))

    # How Qwen-MoE checkpoints name an expert's gate, up and down projections.
    QWEN_EXPERT_NAMES = ("model.layers.{layer}.mlp.experts.{e}.gate_proj.weight",
                         "model.layers.{layer}.mlp.experts.{e}.up_proj.weight",
                         "model.layers.{layer}.mlp.experts.{e}.down_proj.weight")

    def test_qwen_moe_experts_are_served_fused_and_one_by_one(self):
        directory, tensors = self.write_moe("qwen", layers=2, experts=6, naming=self.qwen_names)
        self.check("qwen", directory, tensors, QWEN2_MOE, 2, 6,
                   *self.QWEN_EXPERT_NAMES)
        with self.client.session() as session:
            q = "model.layers.1.self_attn.q_proj.weight"
            self.assertTrue(torch.equal(self.fetch(session, f"qwen/{q}", q), tensors[q]))

    def test_mixtral_experts_and_router_in_a_block(self):
        directory, tensors = self.write_moe("mixtral", layers=2, experts=4,
                                            naming=self.mixtral_names, dtype=torch.float32)
        self.check("mixtral", directory, tensors, MIXTRAL, 2, 4,
                   "model.layers.{layer}.block_sparse_moe.experts.{e}.w1.weight",
                   "model.layers.{layer}.block_sparse_moe.experts.{e}.w3.weight",
                   "model.layers.{layer}.block_sparse_moe.experts.{e}.w2.weight", grouping="block")
        with self.client.session() as session:
            router = self.fetch(session, "mixtral/model.layers.1", "model.layers.1.mlp.gate.weight")
        self.assertTrue(torch.equal(router, tensors["model.layers.1.block_sparse_moe.gate.weight"]))
        names = {t.name for info in self.client.list_objects("mixtral") for t in info.tensors}
        self.assertFalse([n for n in names if "block_sparse_moe" in n], names)

    def test_a_single_expert_and_a_zero_size_expert_tensor(self):
        directory, tensors = self.write_moe("one", layers=1, experts=1, naming=self.qwen_names)
        self.check("one", directory, tensors, QWEN2_MOE, 1, 1,
                   *self.QWEN_EXPERT_NAMES)
        directory, tensors = self.write_moe("empty", layers=1, experts=3, naming=self.qwen_names,
                                            intermediate=0)
        derived = conversions.derived_tensors(conversions.read_checkpoint_index(directory),
                                              QWEN2_MOE)
        self.client.register_model("empty", directory, grouping="tensor", derived=derived)
        shapes = {t.name: list(t.shape) for info in self.client.list_objects("empty")
                  for t in info.tensors}
        self.assertEqual(shapes["model.layers.0.mlp.experts.gate_up_proj"], [3, 0, 16])
        self.assertEqual(shapes["model.layers.0.mlp.experts.down_proj"], [3, 16, 0])
        # The zero-size per-expert tensors are replaced too: only the fused ones remain.
        self.assertFalse([name for name in shapes if ".experts.0." in name], sorted(shapes))

    def test_a_registration_of_many_ranges_passes_grpcs_default_message_limit(self):
        # 60,000 ranges under a 100-character name: about 7 MB, past gRPC's default 4 MiB.
        name = "model.layers.0." + "x" * 79 + ".weight"
        values = torch.arange(60000, dtype=torch.float32)
        directory = self.model_dir("many")
        save_safetensors({name: values}, os.path.join(directory, "model.safetensors"))
        reversed_elements = tierd.v1.tierd_pb2.DerivedTensor(
            name="reversed", dtype="F32", shape=[60000],
            ranges=[tierd.v1.tierd_pb2.TensorRange(tensor=name, offset=4 * i, length=4)
                    for i in reversed(range(60000))])
        self.assertGreater(reversed_elements.ByteSize(), 4 << 20)
        self.client.register_model("many", directory, grouping="tensor",
                                   derived=[reversed_elements])
        with self.client.session() as session:
            self.assertTrue(torch.equal(self.fetch(session, "many/reversed", "reversed"),
                                        values.flip(0)))

    def test_the_daemon_refuses_a_derived_tensor_that_reads_a_byte_twice(self):
        directory, _ = self.write_moe("twice", layers=1, experts=2, naming=self.qwen_names)
        derived = conversions.derived_tensors(conversions.read_checkpoint_index(directory),
                                              QWEN2_MOE)
        derived[0].ranges.append(derived[0].ranges[0])
        del derived[0].shape[:]
        derived[0].shape.append(sum(r.length for r in derived[0].ranges) // 2)  # BF16
        with self.assertRaises(TierdError) as caught:
            self.client.register_model("twice", directory, grouping="tensor", derived=derived)
        self.assertIn("overlap", str(caught.exception))
        self.assertIn(derived[0].name, str(caught.exception))
        self.assertEqual(list(self.client.list_models()), [])


if __name__ == "__main__":
    unittest.main()
