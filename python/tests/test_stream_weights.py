"""tierd.torch.stream_weights: a DiT streamed block by block (and phase by phase) through a GPU pool
smaller than the model gives the same outputs as the module holding all its weights."""

import os
import time
from unittest import mock

import torch

import tierd
import tierd.torch
import tierd.transformers
from dit_model import DiT, save_safetensors
from tierd_testing import Daemon, DaemonTestCase, synchronize, torch_device

BLOCKS = 6
CONFIG = dict(blocks=BLOCKS, dim=64, ffn_dim=256, heads=4, in_dim=16, context_dim=32)


def block_bytes(model):
    return sum(t.numel() * t.element_size() for t in model.blocks[0].state_dict().values())


class StreamWeightsTest(DaemonTestCase):
    # 1.5 MiB of staging for 264 KiB blocks and 160 KiB of other weights: the six blocks cannot all
    # stay on the GPU.
    daemon_flags = dict(gpu_pool="1536KiB", gpu_slab="1536KiB")

    def setUp(self):
        super().setUp()
        torch.manual_seed(3)
        self.device = torch_device()
        self.reference = DiT(**CONFIG).to(self.device).eval()
        self.assertGreater(block_bytes(self.reference) * BLOCKS, 1536 << 10)
        self.register_module("dit", self.reference)
        self.client.register_model("dit-phases", self.model_dir("dit"), grouping="phase")
        generator = torch.Generator().manual_seed(11)
        self.inputs = [(torch.randn(2, 24, 16, generator=generator).to(self.device),
                        torch.randn(2, 8, 32, generator=generator).to(self.device),
                        torch.rand(2, generator=generator).to(self.device)) for _ in range(3)]
        with torch.no_grad():
            self.expected = [self.reference(*args) for args in self.inputs]

    def fresh_module(self):
        # Different random weights: every weight that matters has to come from tierd.
        torch.manual_seed(99)
        return DiT(**CONFIG).to(self.device).eval()

    def run_streamed(self, model, module=None, **options):
        module = self.fresh_module() if module is None else module
        with tierd.torch.stream_weights(module, self.client, model, **options) as streamed:
            with torch.no_grad():
                outputs = [module(*args) for args in self.inputs]
            synchronize()
            fetches = streamed.fetches
            units = (streamed.streamed_units, streamed.resident_units)
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "the streaming session's leases released")
        return outputs, fetches, units

    def assert_outputs_equal(self, outputs):
        for got, want in zip(outputs, self.expected):
            self.assertTrue(torch.equal(got, want), f"max difference {(got - want).abs().max()}")

    def test_blocks_stream_and_outputs_match(self):
        outputs, fetches, (streamed, resident) = self.run_streamed("dit", prefetch_depth=2)
        self.assert_outputs_equal(outputs)
        self.assertEqual(streamed, [f"blocks.{b}" for b in range(BLOCKS)])
        self.assertIn("head", resident)
        self.assertEqual(fetches, BLOCKS * len(self.inputs))
        stats = self.client.stats()
        self.assertGreater(stats.gpu.evictions, 0, "the pool was meant to be too small")

    def test_resident_blocks_stay_and_the_rest_stream(self):
        outputs, fetches, (streamed, resident) = self.run_streamed(
            "dit", prefetch_depth=1, resident_blocks=2)
        self.assert_outputs_equal(outputs)
        self.assertEqual(streamed, [f"blocks.{b}" for b in range(2, BLOCKS)])
        self.assertIn("blocks.0", resident)
        self.assertEqual(fetches, (BLOCKS - 2) * len(self.inputs))

    def test_phases_stream_and_outputs_match(self):
        outputs, fetches, (streamed, _) = self.run_streamed("dit-phases", granularity="phase",
                                                            prefetch_depth=3)
        self.assert_outputs_equal(outputs)
        self.assertIn("blocks.0.self_attn", streamed)
        self.assertIn("blocks.0.cross_attn", streamed)
        self.assertIn("blocks.0.ffn", streamed)
        self.assertEqual(fetches, len(streamed) * len(self.inputs))

    def test_block_granularity_over_phase_objects(self):
        outputs, _, (streamed, _) = self.run_streamed("dit-phases", granularity="block")
        self.assert_outputs_equal(outputs)
        self.assertEqual(streamed, [f"blocks.{b}" for b in range(BLOCKS)])

    def test_a_module_built_on_the_meta_device_streams(self):
        outputs, _, _ = self.run_streamed("dit", module=DiT(**CONFIG).to("meta").eval())
        self.assert_outputs_equal(outputs)

    def hosted_blocks_after_the_first(self, **options):
        """Streams one call of a fresh module through a daemon whose host tier was emptied;
        returns, as block 0's forward ends, which blocks the host tier holds (blocks 2 and 3 given
        up to 10 s to arrive when read ahead), and the outputs."""
        self.client.evict("dit/", tier="all")
        module = self.fresh_module()
        hosted = {}

        def in_host(block):
            infos = [info for info in self.client.list_objects("dit")
                     if info.key == f"dit/blocks.{block}"]
            self.assertEqual(len(infos), 1)
            return infos[0].in_host_cache

        def after_block0(_module, _inputs, _output):
            if hosted:
                return
            if options.get("host_read_ahead", 8) > 0:
                deadline = time.monotonic() + 10
                while not (in_host(2) and in_host(3)) and time.monotonic() < deadline:
                    time.sleep(0.01)
            hosted.update({block: in_host(block) for block in range(BLOCKS)})

        with tierd.torch.stream_weights(module, self.client, "dit", prefetch_depth=1,
                                        **options) as streamed:
            hook = module.blocks[0].register_forward_hook(after_block0)
            with torch.no_grad():
                outputs = [module(*self.inputs[0])]
            synchronize()
            hook.remove()
            self.assertEqual(streamed.fetches, BLOCKS)
        return hosted, outputs

    def test_the_blocks_past_the_prefetch_window_are_read_into_the_host_tier(self):
        # Block 0 taken, block 1 fetched ahead: blocks 2 and 3 asked into the host tier only, and
        # nothing yet of 4 and 5 (asked as blocks 1 and 2 start).
        hosted, outputs = self.hosted_blocks_after_the_first(host_read_ahead=2)
        self.assertEqual([hosted[block] for block in range(2, BLOCKS)], [True, True, False, False],
                         hosted)
        self.assertTrue(torch.equal(outputs[0], self.expected[0]))

    def test_no_host_read_ahead_reads_nothing_past_the_window(self):
        hosted, outputs = self.hosted_blocks_after_the_first(host_read_ahead=0)
        self.assertEqual([hosted[block] for block in range(2, BLOCKS)], [False] * (BLOCKS - 2),
                         hosted)
        self.assertTrue(torch.equal(outputs[0], self.expected[0]))

    def test_no_prefetch_still_matches(self):
        outputs, _, _ = self.run_streamed("dit", prefetch_depth=0)
        self.assert_outputs_equal(outputs)

    def stream_with_pool(self, name, blocks_in_pool, depth):
        """Streams through a daemon whose pool holds the resident objects and `blocks_in_pool`
        blocks; returns the outputs and the daemon's GPU evictions."""
        def staged(size):
            return -(-size // 4096) * 4096

        objects = self.client.list_objects("dit")
        block = max(staged(o.size) for o in objects if o.key.startswith("dit/blocks."))
        resident = sum(staged(o.size) for o in objects if not o.key.startswith("dit/blocks."))
        pool = resident + blocks_in_pool * block
        daemon = Daemon(self.model_dir(name), gpu_pool=str(pool), gpu_slab=str(pool))
        try:
            with tierd.Client(daemon.socket) as client:
                client.register_model("dit", self.model_dir("dit"))
                module = self.fresh_module()
                with tierd.torch.stream_weights(module, client, "dit", prefetch_depth=depth):
                    with torch.no_grad():
                        outputs = [module(*args) for args in self.inputs]
                    synchronize()
                return outputs, client.stats().gpu.evictions
        finally:
            daemon.stop()

    def test_a_pool_of_depth_plus_one_blocks_is_enough(self):
        outputs, evictions = self.stream_with_pool("tight", blocks_in_pool=3, depth=2)
        self.assert_outputs_equal(outputs)
        self.assertGreater(evictions, 0)
        # One block fewer cannot hold the window: refused, not hung.
        with self.assertRaises(tierd.TierdError) as caught:
            self.stream_with_pool("too-tight", blocks_in_pool=2, depth=2)
        self.assertEqual(caught.exception.code, tierd.StatusCode.RESOURCE_EXHAUSTED)

    def test_mistakes_are_refused_clearly(self):
        module = self.fresh_module()
        with self.assertRaisesRegex(ValueError, "grouping"):
            tierd.torch.stream_weights(module, self.client, "dit", granularity="phase")
        with self.assertRaisesRegex(ValueError, "host_read_ahead must not be negative"):
            tierd.torch.stream_weights(module, self.client, "dit", host_read_ahead=-1)
        with self.assertRaisesRegex(tierd.TierdError, "not registered"):
            tierd.torch.stream_weights(module, self.client, "nothing")
        wider = DiT(**dict(CONFIG, ffn_dim=320)).to(self.device)
        with self.assertRaisesRegex(ValueError, "in the module"):
            tierd.torch.stream_weights(wider, self.client, "dit")
        with tierd.torch.stream_weights(module, self.client, "dit") as streamed:
            patches, context, time = self.inputs[0]
            with self.assertRaisesRegex(RuntimeError, "inference only"):
                module(patches.requires_grad_(), context, time)
            patches.requires_grad_(False)
            # Outside a forward the streamed weights are empty, not stale views of staging memory.
            self.assertEqual(module.blocks[3].ffn.up.weight.numel(), 0)
            self.assertEqual(streamed.fetches, 0)
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "leases released after the refusals")


class TiedLM(torch.nn.Module):
    """The parts of a Hugging Face causal LM that a checkpoint leaves out: an LM head tied to the
    embedding (saved once), and a buffer computed when the module is built (as rotary frequencies
    are), not saved at all."""

    def __init__(self, vocab=64, dim=32, blocks=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(blocks))
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, dim), persistent=False)

    def forward(self, ids):
        x = self.embed(ids) * self.scale
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


class StreamWeightsWithoutTheCheckpointsGapsTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        torch.manual_seed(5)
        self.device = torch_device()
        self.reference = TiedLM().to(self.device).eval()
        state = {name: tensor for name, tensor in self.reference.state_dict().items()
                 if name != "head.weight"}  # tied: saved once, as its checkpoint does
        save_safetensors(state, os.path.join(self.model_dir("lm"), "model.safetensors"))
        self.client.register_model("lm", self.model_dir("lm"), grouping="block")
        self.ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            self.expected = self.reference(self.ids.to(self.device))

    def test_tied_weights_and_built_buffers_of_a_module_without_weights(self):
        torch.manual_seed(77)  # other weights: every one that matters comes from tierd
        with tierd.transformers.parameters_on_meta():
            module = TiedLM().eval()
        self.assertTrue(module.head.weight.is_meta)
        self.assertIs(module.head.weight, module.embed.weight)  # the tie made in __init__ kept
        self.assertEqual(module.scale.device.type, "cpu")
        with tierd.torch.stream_weights(module, self.client, "lm") as streamed:
            with torch.no_grad():
                got = module(self.ids.to(self.device))
            synchronize()
            self.assertEqual(streamed.streamed_units, [f"blocks.{b}" for b in range(4)])
            self.assertEqual(module.scale.device, self.device)  # moved to the session's device
        self.assertTrue(torch.equal(got, self.expected), f"max difference "
                        f"{(got - self.expected).abs().max()}")
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "the streaming session's leases released")

    def test_a_tensor_left_without_values_is_refused_by_name_before_any_forward(self):
        module = TiedLM().to("meta").eval()  # the buffer too: nothing can give it values
        # (Older torch also unties the head as it moves the module: then it is named too.)
        with self.assertRaisesRegex(ValueError, r"\bscale (is|are) on the meta device and not in "
                                                r"lm.*init_empty_weights"):
            tierd.torch.stream_weights(module, self.client, "lm")
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "nothing held after the refusal")


class ResidentFetchesTest(DaemonTestCase):
    """Every block resident (map_weights): the daemon is asked for the next units' objects before
    the first unit's answers are waited for, within a bound of requests."""
    daemon_flags = dict(gpu_pool="4MiB", gpu_slab="4MiB")

    def setUp(self):
        super().setUp()
        torch.manual_seed(3)
        self.device = torch_device()
        self.reference = DiT(**CONFIG).to(self.device).eval()
        self.register_module("dit", self.reference)
        self.inputs = (torch.randn(2, 24, 16).to(self.device), torch.randn(2, 8, 32).to(self.device),
                       torch.rand(2).to(self.device))

    def map_recording(self):
        """Maps the DiT's weights into a fresh module, recording each fetch sent ("send", keys) and
        each answer waited for ("wait", key); returns the events and whether outputs matched."""
        events = []
        send, wait = tierd.Session.fetch_many_async, tierd.PendingFetch.result

        def recorded_send(session, keys, *args, **kwargs):
            keys = list(keys)
            events.append(("send", keys))
            return send(session, keys, *args, **kwargs)

        def recorded_wait(fetch, *args, **kwargs):
            events.append(("wait", fetch.key))
            return wait(fetch, *args, **kwargs)

        torch.manual_seed(99)
        module = DiT(**CONFIG).to("meta").eval()
        with mock.patch.object(tierd.Session, "fetch_many_async", recorded_send), \
                mock.patch.object(tierd.PendingFetch, "result", recorded_wait):
            with tierd.torch.map_weights(module, self.client, "dit"):
                with torch.no_grad():
                    equal = torch.equal(module(*self.inputs), self.reference(*self.inputs))
        return events, equal

    @staticmethod
    def most_sent_unanswered(events):
        sent = waited = most = 0
        for kind, what in events:
            if kind == "send":
                sent += len(what)
                most = max(most, sent - waited)
            else:
                waited += 1
        return most

    def test_later_units_are_asked_for_before_the_first_is_waited_on(self):
        events, equal = self.map_recording()
        self.assertTrue(equal)
        first_wait = next(i for i, (kind, _) in enumerate(events) if kind == "wait")
        self.assertGreaterEqual(first_wait, BLOCKS, f"fetches sent before the first wait: {events}")
        self.assertEqual(sum(len(keys) for kind, keys in events if kind == "send"),
                         len(self.client.list_objects("dit")))

    def test_the_fetches_sent_ahead_are_bounded(self):
        with mock.patch.object(tierd.torch, "_RESIDENT_REQUESTS_AHEAD", 3):
            events, equal = self.map_recording()
        self.assertTrue(equal)
        self.assertLessEqual(self.most_sent_unanswered(events), 3, events)
        self.assertGreater(self.most_sent_unanswered(events), 1, events)
