"""tierd.torch.stream_weights and tierd.transformers.from_pretrained on Hugging Face transformers
models as their users build them: saved with save_pretrained (sharded safetensors and an index),
registered with block grouping, built without their weights, streamed through a GPU pool smaller
than the model. Logits and greedy generation equal the resident model's. Those tests need
transformers (the GPU machine has it; it is not a Debian package) and are skipped without it;
from_pretrained's own logic (names, dtypes, registration, parameters on meta) runs everywhere."""

import os
import unittest

import torch

import tierd
import tierd.torch
import tierd.transformers
from dit_model import save_safetensors
from tierd_testing import DaemonTestCase, run_python, synchronize, torch_device

try:
    import transformers
except ImportError:
    transformers = None

try:
    import accelerate
except ImportError:
    accelerate = None


def build_without_weights(config):
    """As a user would: accelerate.init_empty_weights() where accelerate is installed, else
    tierd.transformers.parameters_on_meta() (both keep buffers real)."""
    context = (accelerate.init_empty_weights() if accelerate is not None
               else tierd.transformers.parameters_on_meta())
    with context:
        return transformers.AutoModelForCausalLM.from_config(config).eval()


@unittest.skipIf(transformers is None, "transformers is not installed")
class TransformersStreamTest(DaemonTestCase):
    # The models below have about 0.5 MiB per block: the pool holds the rest and a few blocks.
    daemon_flags = dict(gpu_pool="3MiB", gpu_slab="3MiB")

    def check_model(self, name, config):
        torch.manual_seed(0)
        reference = transformers.AutoModelForCausalLM.from_config(config).eval()
        directory = self.model_dir(name)
        reference.save_pretrained(directory, safe_serialization=True, max_shard_size="400KB")
        self.client.register_model(name, directory, grouping="block")
        device = torch_device()
        reference = reference.to(device)
        ids = torch.randint(0, config.vocab_size, (2, 12),
                            generator=torch.Generator().manual_seed(2)).to(device)
        with torch.no_grad():
            expected_logits = reference(ids).logits
            expected_tokens = reference.generate(ids, max_new_tokens=6, do_sample=False)

        module = build_without_weights(config)
        with tierd.torch.stream_weights(module, self.client, name, prefetch_depth=1) as streamed:
            with torch.no_grad():
                logits = module(ids).logits
                tokens = module.generate(ids, max_new_tokens=6, do_sample=False)
            synchronize()
            self.assertEqual(len(streamed.streamed_units), config.num_hidden_layers)
        self.assertTrue(torch.equal(logits, expected_logits),
                        f"max difference {(logits - expected_logits).abs().max()}")
        self.assertTrue(torch.equal(tokens, expected_tokens))
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "the streaming session's leases released")

    def test_a_llama_built_without_its_weights_streams_exactly(self):
        self.check_model("llama", transformers.LlamaConfig(
            vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))

    def test_a_gpt2_with_a_tied_head_streams_exactly(self):
        self.check_model("gpt2", transformers.GPT2Config(
            vocab_size=256, n_embd=128, n_layer=6, n_head=4, n_positions=64))

    def test_from_pretrained_streams_a_checkpoint_directory_exactly(self):
        config = transformers.LlamaConfig(
            vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        torch.manual_seed(0)
        reference = transformers.AutoModelForCausalLM.from_config(config).eval()
        directory = self.model_dir("Llama tiny")
        reference.save_pretrained(directory, safe_serialization=True, max_shard_size="400KB")
        reference.generation_config.save_pretrained(directory)
        device = torch_device()
        reference = reference.to(device)
        ids = torch.randint(0, config.vocab_size, (2, 12),
                            generator=torch.Generator().manual_seed(3)).to(device)
        with torch.no_grad():
            expected_logits = reference(ids).logits
            expected_tokens = reference.generate(ids, max_new_tokens=6, do_sample=False)
        for _ in range(2):  # the second call finds the model registered already
            model = tierd.transformers.from_pretrained(directory, self.client, prefetch_depth=1)
            with torch.no_grad():
                logits = model(ids).logits
                tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
            synchronize()
            model.tierd_weights.close()
            self.assertTrue(torch.equal(logits, expected_logits),
                            f"max difference {(logits - expected_logits).abs().max()}")
            self.assertTrue(torch.equal(tokens, expected_tokens))
        self.assertEqual([m.name for m in self.client.list_models()], ["Llama-tiny"])
        with self.assertRaises(ValueError) as caught:
            tierd.transformers.from_pretrained(directory, self.client, dtype=torch.float16)
        self.assertIn("float32", str(caught.exception))
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "the streaming sessions' leases released")


# Small configurations of the architectures from_pretrained is checked on: (config class, its
# arguments). The dense eight, then the mixtures of experts, whose checkpoints store one tensor per
# expert (gpt-oss: fused already) and which transformers 5 loads through its conversion mapping.
_BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
_EXPERTS = dict(num_experts_per_tok=2)
ARCHITECTURES = {
    "llama": ("LlamaConfig", _BASE),
    "qwen2": ("Qwen2Config", _BASE),
    "qwen3": ("Qwen3Config", dict(_BASE, head_dim=16)),
    "mistral": ("MistralConfig", _BASE),
    "gemma2": ("Gemma2Config", dict(_BASE, head_dim=16)),
    "phi3": ("Phi3Config", _BASE),
    "gpt2": ("GPT2Config", dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                bos_token_id=1, eos_token_id=2)),
    "opt": ("OPTConfig", dict(vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                              num_attention_heads=4, max_position_embeddings=64,
                              word_embed_proj_dim=64, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2)),
    "mixtral": ("MixtralConfig", dict(_BASE, **_EXPERTS, num_local_experts=8)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(_BASE, **_EXPERTS, num_experts=8, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=64)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(_BASE, **_EXPERTS, head_dim=16, num_experts=8,
                                         moe_intermediate_size=32)),
    "deepseek_v3": ("DeepseekV3Config", dict(
        _BASE, **dict(_EXPERTS, num_key_value_heads=4), moe_intermediate_size=32, n_routed_experts=8,
        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=32,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)),
    "olmoe": ("OlmoeConfig", dict(_BASE, **_EXPERTS, num_experts=8)),
    "gpt_oss": ("GptOssConfig", dict(_BASE, **_EXPERTS, intermediate_size=32, head_dim=16,
                                     num_local_experts=8, sliding_window=16)),
}
MIXTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "olmoe", "gpt_oss")


@unittest.skipIf(transformers is None, "transformers is not installed")
class ArchitectureMatrixTest(DaemonTestCase):
    """from_pretrained against transformers' own from_pretrained of the same directory, saved by
    save_pretrained in shards: equal logits and greedy tokens, both ways of serving experts for
    the mixtures. An architecture transformers cannot build or save is skipped with its error.
    With TIERD_MATRIX_JSON set, each result is appended to that file as a JSON line."""

    daemon_flags = dict(gpu_pool="8MiB", gpu_slab="4MiB")

    def record(self, **result):
        path = os.environ.get("TIERD_MATRIX_JSON")
        if path:
            import json
            with open(path, "a", encoding="utf-8") as file:
                file.write(json.dumps(dict(result, transformers=transformers.__version__)) + "\n")

    def check_architecture(self, architecture):
        config_class, arguments = ARCHITECTURES[architecture]
        directory = self.model_dir(architecture)
        try:
            config = getattr(transformers, config_class)(**arguments)
            torch.manual_seed(0)
            built = transformers.AutoModelForCausalLM.from_config(config).eval()
            built.save_pretrained(directory, safe_serialization=True, max_shard_size="200KB")
        except Exception as error:  # what transformers itself cannot do is listed, not failed
            self.record(architecture=architecture, result="not built or saved",
                        error=f"{type(error).__name__}: {error}")
            self.skipTest(f"transformers {transformers.__version__} cannot build or save "
                          f"{architecture}: {type(error).__name__}: {error}")
        device = torch_device()
        reference = transformers.AutoModelForCausalLM.from_pretrained(directory).to(device).eval()
        ids = torch.randint(3, config.vocab_size, (2, 10),
                            generator=torch.Generator().manual_seed(5)).to(device)
        with torch.no_grad():
            expected_logits = reference(ids).logits
            expected_tokens = reference.generate(ids, max_new_tokens=5, do_sample=False)
        modes = ("stream", "on_demand") if architecture in MIXTURES else ("stream",)
        for mode in modes:
            with self.subTest(mode=mode):
                try:
                    model = tierd.transformers.from_pretrained(directory, self.client,
                                                               prefetch_depth=1, experts=mode)
                except ValueError as error:
                    self.record(architecture=architecture, experts=mode, result="refused",
                                error=str(error))
                    raise
                with torch.no_grad():
                    logits = model(ids).logits
                    tokens = model.generate(ids, max_new_tokens=5, do_sample=False)
                synchronize()
                experts = getattr(model, "tierd_experts", None)
                model.tierd_weights.close()
                exact = torch.equal(logits, expected_logits) and torch.equal(tokens, expected_tokens)
                self.record(architecture=architecture, experts=mode,
                            result="exact" if exact else "differs",
                            max_logit_difference=float((logits - expected_logits).abs().max()),
                            derived_tensors=next(m.derived_tensors
                                                 for m in self.client.list_models()
                                                 if m.directory == directory and
                                                 m.grouping == (tierd.v1.tierd_pb2.GROUPING_TENSOR
                                                                if mode == "on_demand" else
                                                                tierd.v1.tierd_pb2.GROUPING_BLOCK)),
                            experts_fetched=experts.fetched if experts else None)
                self.assertTrue(torch.equal(logits, expected_logits),
                                f"{architecture} ({mode}): max difference "
                                f"{(logits - expected_logits).abs().max()}")
                self.assertTrue(torch.equal(tokens, expected_tokens), f"{architecture} ({mode})")
                if mode == "on_demand":
                    self.assertGreater(experts.fetched, 0)
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "every lease released")


for _architecture in ARCHITECTURES:
    setattr(ArchitectureMatrixTest, f"test_{_architecture}",
            lambda self, architecture=_architecture: self.check_architecture(architecture))


class FromPretrainedLogicTest(DaemonTestCase):
    """What from_pretrained decides before transformers builds anything: runs without it."""

    def test_a_directory_names_its_model(self):
        self.assertEqual(tierd.transformers.model_name_for("/m/Llama-3.1 8B/"), "Llama-3.1-8B")
        self.assertEqual(tierd.transformers.model_name_for("/m/.hidden"), "hidden")
        with self.assertRaises(ValueError):
            tierd.transformers.model_name_for("/")

    def test_the_checkpoint_dtype_is_where_most_floating_point_bytes_are(self):
        directory = self.model_dir("mixed")
        save_safetensors({"a.weight": torch.zeros(64, 64, dtype=torch.bfloat16),
                          "b.weight": torch.zeros(8, dtype=torch.float32),
                          "c.index": torch.zeros(4096, dtype=torch.int64)},
                         os.path.join(directory, "model.safetensors"))
        self.client.register_model("mixed", directory)
        objects = self.client.list_objects("mixed")
        self.assertEqual(tierd.transformers.checkpoint_dtype(objects), torch.bfloat16)

    def test_a_name_taken_by_another_directory_or_grouping_is_refused(self):
        for name in ("first", "second"):
            save_safetensors({"blocks.0.w": torch.zeros(4)},
                             os.path.join(self.model_dir(name), "model.safetensors"))
        register = tierd.transformers.register_checkpoint
        register(self.client, "taken", self.model_dir("first"))
        register(self.client, "taken", self.model_dir("first") + "/")  # the same: nothing to do
        with self.assertRaises(ValueError) as caught:
            register(self.client, "taken", self.model_dir("second"))
        self.assertIn("pass another name=", str(caught.exception))
        self.client.register_model("by_tensor", self.model_dir("second"), grouping="tensor")
        with self.assertRaises(ValueError) as caught:
            register(self.client, "by_tensor", self.model_dir("second"))
        self.assertIn("block grouping", str(caught.exception))
        self.assertEqual(sorted(m.name for m in self.client.list_models()), ["by_tensor", "taken"])

    @unittest.skipIf(transformers is not None, "transformers is installed")
    def test_without_transformers_from_pretrained_says_what_it_needs(self):
        with self.assertRaises(ImportError) as caught:
            tierd.transformers.from_pretrained(self.model_dir("none"), self.client)
        self.assertIn("needs the transformers package", str(caught.exception))
        self.assertEqual(list(self.client.list_models()), [])

    def test_parameters_go_to_meta_and_buffers_stay_real(self):
        class Rotary(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 8)
                self.register_buffer("inv_freq", torch.arange(4.0), persistent=False)

        with tierd.transformers.parameters_on_meta():
            module = Rotary()
        self.assertEqual(module.linear.weight.device.type, "meta")
        self.assertIsInstance(module.linear.weight, torch.nn.Parameter)
        # Marked initialized: transformers' weight initialization leaves it alone.
        self.assertTrue(module.linear.weight._is_hf_initialized)
        self.assertEqual(module.inv_freq.device.type, "cpu")
        self.assertTrue(torch.equal(module.inv_freq, torch.arange(4.0)))
        # Outside it, modules are built as usual.
        self.assertEqual(torch.nn.Linear(2, 2).weight.device.type, "cpu")


@unittest.skipIf(transformers is None, "transformers is not installed")
class TierdCacheTest(DaemonTestCase):
    """tierd.transformers.TierdCache under generate(): the same tokens as transformers' own cache,
    and a prefix saved by one process continued by another."""

    CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

    def save_model(self):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.LlamaConfig(**self.CONFIG)).eval()
        directory = self.model_dir("llama")
        model.save_pretrained(directory, safe_serialization=True)
        return directory

    def load_model(self, directory):
        return transformers.AutoModelForCausalLM.from_pretrained(directory).to(torch_device()).eval()

    def test_greedy_generate_equals_the_default_caches(self):
        model = self.load_model(self.save_model())
        ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(4))
        ids = ids.to(torch_device())
        with torch.no_grad():
            expected = model.generate(ids, max_new_tokens=12, do_sample=False)
            with self.client.session() as session:
                cache = tierd.transformers.TierdCache(session, "gen", config=model.config,
                                                      chunk_tokens=16)
                tokens = model.generate(ids, past_key_values=cache, max_new_tokens=12,
                                        do_sample=False)
                self.assertEqual(cache.get_seq_length(), 40 + 11)
                cache.close()
                session.flush()
        self.assertTrue(torch.equal(tokens, expected), f"{tokens}\n{expected}")
        # 51 tokens: three chunks of 16 per layer were stored.
        self.assertEqual(self.client.stats().stored_objects, 3 * self.CONFIG["num_hidden_layers"])
        self.wait_for_stats(lambda stats: stats.leases == 0, "every chunk's lease released")

    def test_a_prefix_saved_by_one_process_is_continued_by_another(self):
        directory = self.save_model()
        prefix = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(5))
        question = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(6))
        writer = run_python(
            "import sys, torch, tierd, tierd.transformers, transformers\n"
            "from tierd_testing import torch_device\n"
            "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[2])\n"
            "model = model.to(torch_device()).eval()\n"
            "prefix = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(5))\n"
            "session = tierd.Client(sys.argv[1]).session()\n"
            "cache = tierd.transformers.TierdCache(session, 'doc', config=model.config,\n"
            "                                      chunk_tokens=32)\n"
            "with torch.no_grad():\n"
            "    model(prefix.to(torch_device()), past_key_values=cache, use_cache=True)\n"
            "cache.save()\n"
            "session.close()\n", self.daemon.socket, directory)
        _, errors = writer.communicate(timeout=120)
        self.assertEqual(writer.returncode, 0, errors)

        model = self.load_model(directory)
        ids = torch.cat([prefix, question], dim=1).to(torch_device())
        with torch.no_grad():
            # The reference computes the prefix first too, in transformers' own cache.
            own = transformers.DynamicCache(config=model.config)
            model(prefix.to(torch_device()), past_key_values=own, use_cache=True)
            expected = model.generate(ids, past_key_values=own, max_new_tokens=8, do_sample=False)
            with self.client.session() as session:
                cache = tierd.transformers.TierdCache.open(session, "doc")
                self.assertEqual(cache.get_seq_length(), 70)
                tokens = model.generate(ids, past_key_values=cache, max_new_tokens=8,
                                        do_sample=False)
                cache.close()
        self.assertTrue(torch.equal(tokens, expected), f"{tokens}\n{expected}")
