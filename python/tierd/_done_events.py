"""A session's done events on the client's side (SessionOpened.done_event_ids): which one to record
after the last use of a lease or the last write into a reservation, to name in the release or commit.

The daemon waits for the newest record of the event a release names, which may be a later record
than the release's own. That is safe when every record since the release's own came after it on the
same stream (stream order), or when the release's record had completed before the event was
recorded again. So an event is recorded again only on the stream of its last record, or once that
record has completed. For a stream, the choice is: the event last recorded on it; else one never
recorded or whose last record completed; else, all busy on other streams, the least recently
recorded one once the CPU has waited for it. With no done events (the daemon had none to give) the
stream is synchronized instead and nothing is named. The same rules as the C++ client's
(wire/done_events.h).
"""

import threading


class DoneEvents:
    """Thread-safe. `events` is a list of (id, opened event); `backend` records, queries and waits."""

    def __init__(self, backend, events):
        self._backend = backend
        self._lock = threading.Lock()
        # [id, event, stream key of its last record or None, when it was last recorded]
        self._slots = [[event_id, event, None, 0] for event_id, event in events]
        self._records = 0

    def __len__(self):
        return len(self._slots)

    def _choose(self, key):
        for slot in self._slots:
            if slot[2] is not None and slot[2] == key:
                return slot
        oldest = None
        for slot in self._slots:
            if slot[3] == 0 or self._backend.query_event(slot[1]):
                return slot
            if oldest is None or slot[3] < oldest[3]:
                oldest = slot
        self._backend.synchronize_event(oldest[1])
        return oldest

    def record_after(self, stream):
        """Records a done event on `stream` after the work enqueued there and returns its id, or
        None when no event is needed: the stream's work has all completed (then nothing touches an
        interprocess event), or it was synchronized instead."""
        if self._backend.stream_idle(stream):
            return None
        with self._lock:
            if self._slots:
                slot = self._choose(self._backend.stream_key(stream))
                self._backend.record_event(slot[1], stream)
                self._records += 1
                slot[2] = self._backend.stream_key(stream)
                slot[3] = self._records
                return slot[0]
        self._backend.synchronize_stream(stream)
        return None
