"""Which of a session's done events a release records (tierd/_done_events.py), the rules of the C++
client's wire/done_events.h: the event last recorded on the stream, else one whose record has
completed, else the oldest once the CPU has waited for it; an idle stream names none."""

import unittest

from tierd._done_events import DoneEvents


class FakeBackend:
    """Records on named streams; an event's record completes when the test says so."""

    def __init__(self):
        self.busy_streams = set()
        self.pending = set()  # events whose newest record has not completed
        self.waited = []
        self.synchronized = []

    def stream_idle(self, stream):
        return stream not in self.busy_streams

    def stream_key(self, stream):
        return stream

    def record_event(self, event, stream):
        self.pending.add(event)

    def query_event(self, event):
        return event not in self.pending

    def synchronize_event(self, event):
        self.waited.append(event)
        self.pending.discard(event)

    def synchronize_stream(self, stream):
        self.synchronized.append(stream)


class DoneEventsTest(unittest.TestCase):
    def setUp(self):
        self.backend = FakeBackend()
        self.backend.busy_streams = {"a", "b", "c"}
        self.done = DoneEvents(self.backend, [(10, "e10"), (11, "e11")])

    def test_an_idle_stream_names_no_event(self):
        self.assertIsNone(self.done.record_after("idle"))
        self.assertNotIn("e10", self.backend.pending)

    def test_a_stream_keeps_its_event_while_its_records_are_pending(self):
        first = self.done.record_after("a")
        self.assertEqual(self.done.record_after("a"), first)
        self.assertEqual(self.done.record_after("a"), first)

    def test_another_stream_takes_an_event_not_pending_elsewhere(self):
        on_a = self.done.record_after("a")
        on_b = self.done.record_after("b")
        self.assertNotEqual(on_a, on_b)
        self.backend.pending.discard("e%d" % on_a)  # a's record completed
        self.assertEqual(self.done.record_after("c"), on_a)
        self.assertEqual(self.backend.waited, [])

    def test_with_every_event_pending_on_other_streams_the_oldest_is_waited_for(self):
        oldest = self.done.record_after("a")
        self.done.record_after("b")
        self.assertEqual(self.done.record_after("c"), oldest)
        self.assertEqual(self.backend.waited, ["e%d" % oldest])

    def test_without_events_the_stream_is_synchronized(self):
        none = DoneEvents(self.backend, [])
        self.assertIsNone(none.record_after("a"))
        self.assertEqual(self.backend.synchronized, ["a"])


if __name__ == "__main__":
    unittest.main()
