"""tierd.experts: a mixture of experts' experts fetched on demand from a real daemon, on a model
built the way transformers 5 builds its MoE layers (a router, then an experts module holding every
expert in fused gate_up_proj / down_proj parameters, called with the routing), saved as a
checkpoint of per-expert tensors and registered with the fused parameters as derived tensors
(tierd.conversions). Outputs equal the resident model's; only the chosen experts are fetched; a
second call finds them in the daemon's GPU pool and the next layer's prefetched. Runs without
transformers; the GPU machine's tests run transformers' own Mixtral and Qwen3-MoE."""

import os
import unittest

import torch

import tierd
import tierd.torch
from tierd import conversions
from tierd.experts import OnDemandExperts, expert_parameters, find_expert_modules
from dit_model import save_safetensors
from test_conversions import QWEN2_MOE
from tierd_testing import DaemonTestCase, synchronize, torch_device

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, LAYERS = 32, 16, 8, 2, 3


class Experts(torch.nn.Module):
    """transformers 5's experts module: every expert's weights in two fused parameters."""

    def __init__(self):
        super().__init__()
        self.num_experts = EXPERTS
        self.gate_up_proj = torch.nn.Parameter(torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN))
        self.down_proj = torch.nn.Parameter(torch.randn(EXPERTS, HIDDEN, INTERMEDIATE))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for expert in torch.unique(top_k_index).tolist():
            token, position = torch.where(top_k_index == expert)
            gate, up = torch.nn.functional.linear(hidden_states[token],
                                                  self.gate_up_proj[expert]).chunk(2, dim=-1)
            result = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up,
                                                self.down_proj[expert])
            out.index_add_(0, token, result * top_k_weights[token, position, None])
        return out


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.mlp = torch.nn.Module()
        self.mlp.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.mlp.experts = Experts()

    def forward(self, hidden):
        hidden = hidden + self.self_attn(hidden)
        probabilities = torch.softmax(self.mlp.gate(hidden), dim=-1)
        weights, index = torch.topk(probabilities, TOP_K, dim=-1)
        return hidden + self.mlp.experts(hidden, index, weights)


class TinyMoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([Layer() for _ in range(LAYERS)])

    def forward(self, hidden):
        for layer in self.model.layers:
            hidden = layer(hidden)
        return hidden


def per_expert_checkpoint(model):
    """The model's state as a checkpoint stores it: one gate, up and down tensor per expert."""
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            prefix = name[:-len("gate_up_proj")]
            for e in range(EXPERTS):
                gate, up = tensor[e].chunk(2, dim=0)
                tensors[f"{prefix}{e}.gate_proj.weight"] = gate.clone()
                tensors[f"{prefix}{e}.up_proj.weight"] = up.clone()
        elif name.endswith("experts.down_proj"):
            prefix = name[:-len("down_proj")]
            for e in range(EXPERTS):
                tensors[f"{prefix}{e}.down_proj.weight"] = tensor[e].clone()
        else:
            tensors[name] = tensor
    return tensors


class OnDemandExpertsTest(DaemonTestCase):
    daemon_flags = dict(gpu_pool="2MiB", gpu_slab="1MiB")

    def setUp(self):
        super().setUp()
        torch.manual_seed(0)
        self.reference = TinyMoE().eval()
        directory = self.model_dir("moe")
        save_safetensors(per_expert_checkpoint(self.reference),
                         os.path.join(directory, "model.safetensors"))
        derived = conversions.derived_tensors(conversions.read_checkpoint_index(directory),
                                              QWEN2_MOE)
        self.client.register_model("moe", directory, grouping="tensor", derived=derived)
        self.reference = self.reference.to(torch_device())

    def settled_stats(self):
        """Stats once the daemon's copies are done: a copy's bytes are counted when it completes,
        which can be after its reader, waiting on the copy's event, has the data."""
        return self.wait_for_stats(lambda stats: stats.copies_in_flight == 0, "copies finished")

    def stream(self, prefetch):
        module = TinyMoE().eval().to("meta")
        experts = find_expert_modules(module)
        self.assertEqual(list(experts), [f"model.layers.{i}.mlp.experts" for i in range(LAYERS)])
        excluded = {f"{path}.{name}" for path, m in experts.items()
                    for name in expert_parameters(m)}
        weights = tierd.torch.stream_weights(module, self.client, "moe", exclude=excluded)
        on_demand = OnDemandExperts(weights.session, "moe", experts, prefetch=prefetch,
                                    weights=weights)
        return module, weights, on_demand

    def test_outputs_equal_and_only_chosen_experts_move(self):
        module, weights, on_demand = self.stream(prefetch=True)
        hidden = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(1))
        hidden = hidden.to(torch_device())
        with torch.no_grad():
            expected = self.reference(hidden)
            before = self.settled_stats()
            first = module(hidden)
            synchronize()
            after_first = self.settled_stats()
            second = module(hidden)
            synchronize()
            after_second = self.settled_stats()
        self.assertTrue(torch.equal(first, expected), f"{(first - expected).abs().max()}")
        self.assertTrue(torch.equal(second, expected))
        # One token, top 2 of 8 in each layer: two experts a layer, each two objects.
        self.assertEqual(on_demand.fetched, 2 * TOP_K * LAYERS)
        expert_bytes = (2 * INTERMEDIATE * HIDDEN + HIDDEN * INTERMEDIATE) * 4
        moved = after_first.bytes_host_to_gpu - before.bytes_host_to_gpu
        dense = LAYERS * (HIDDEN * HIDDEN + EXPERTS * HIDDEN) * 4
        self.assertEqual(moved, TOP_K * LAYERS * expert_bytes + dense)
        # The second call: the same experts, found in the pool and fetched a layer ahead.
        self.assertEqual(on_demand.resident, TOP_K * LAYERS)
        self.assertGreaterEqual(on_demand.prefetched, TOP_K * (LAYERS - 1))
        self.assertEqual(on_demand.wasted, 0)
        self.assertEqual(after_second.bytes_host_to_gpu - after_first.bytes_host_to_gpu, 0)
        weights.close()
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "every expert's lease released")

    def test_another_token_fetches_its_own_experts_and_gives_up_the_guesses(self):
        module, weights, on_demand = self.stream(prefetch=True)
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for _ in range(6):
                hidden = torch.randn(1, HIDDEN, generator=generator).to(torch_device())
                self.assertTrue(torch.equal(module(hidden), self.reference(hidden)))
        synchronize()
        self.assertEqual(on_demand.fetched, 6 * TOP_K * LAYERS)
        self.assertGreater(on_demand.wasted, 0)
        # Batches route tokens to more experts: all the chosen ones come, once each.
        batch = torch.randn(5, HIDDEN, generator=generator).to(torch_device())
        with torch.no_grad():
            self.assertTrue(torch.equal(module(batch), self.reference(batch)))
        weights.close()
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "every expert's lease released")


if __name__ == "__main__":
    unittest.main()
