"""tierd.torch.stream_weights on Hugging Face transformers models as their users build them:
saved with save_pretrained (sharded safetensors and an index), registered with block grouping,
built without their weights, streamed through a GPU pool smaller than the model. Logits and greedy
generation equal the resident model's. Needs transformers (the GPU machine has it; it is not a
Debian package): skipped without it."""

import unittest

import torch

import tierd
import tierd.torch
from parameters_to_meta import parameters_to_meta
from tierd_testing import DaemonTestCase, synchronize, torch_device

try:
    import transformers
except ImportError:
    transformers = None

try:
    import accelerate
except ImportError:
    accelerate = None


def build_without_weights(config):
    """As a user would: accelerate.init_empty_weights() where accelerate is installed (buffers
    stay real), else the same by hand."""
    if accelerate is not None:
        with accelerate.init_empty_weights():
            return transformers.AutoModelForCausalLM.from_config(config).eval()
    return parameters_to_meta(transformers.AutoModelForCausalLM.from_config(config)).eval()


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
