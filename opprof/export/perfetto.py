"""Perfetto protobuf export (ui.perfetto.dev), written with the perfetto package's protos:
one process track per rank, one thread track per lane, slices carrying op/phase/step, and a
counter track per memory series of a rank."""

from __future__ import annotations

from pathlib import Path

from opprof.errors import OpprofError
from opprof.export.tracks import lanes, split_memory
from opprof.files import write_atomic
from opprof.trace import Trace

#: The suffix of a file this exporter writes.
EXTENSION = ".pftrace"

_SEQ = 1


def build(trace: Trace) -> bytes:
    """The serialized perfetto Trace proto."""
    try:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PTrace
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    except ImportError:
        raise OpprofError(
            "--to perfetto needs the perfetto package: pip install -e '.[perfetto]' "
            "-c constraints.txt") from None
    events, memory = split_memory(trace.events)
    ev = lanes(events).sort_values(["lane", "ts", "dur"], ascending=[True, True, False])
    out = PTrace()
    ranks = ev.drop_duplicates("rank")[["rank", "role"]]
    for r in ranks.itertuples(index=False):
        pkt = out.packet.add()
        pkt.track_descriptor.uuid = 1_000_000 + int(r.rank)
        pkt.track_descriptor.process.pid = int(r.rank) + 1
        pkt.track_descriptor.process.process_name = f"rank {r.rank} ({r.role})"
    for r in ev.drop_duplicates("lane")[["rank", "pid", "tid", "device", "lane"]].itertuples(
            index=False):
        pkt = out.packet.add()
        pkt.track_descriptor.uuid = 2_000_000 + int(r.lane)
        pkt.track_descriptor.parent_uuid = 1_000_000 + int(r.rank)
        pkt.track_descriptor.name = f"{r.device} pid {r.pid} tid {r.tid}"
    cols = ["lane", "ts", "dur", "name", "op", "phase", "step", "kind"]
    for r in ev[cols].astype(object).where(ev[cols].notna(), None).itertuples(index=False):
        track = 2_000_000 + int(r.lane)
        begin = out.packet.add()
        begin.timestamp = int(r.ts)
        begin.trusted_packet_sequence_id = _SEQ
        begin.track_event.type = TrackEvent.TYPE_SLICE_BEGIN
        begin.track_event.track_uuid = track
        begin.track_event.name = str(r.name)
        begin.track_event.categories.append(str(r.kind))
        for key, val in (("op", r.op), ("phase", r.phase), ("step", r.step)):
            if val is not None:
                ann = begin.track_event.debug_annotations.add()
                ann.name = key
                ann.string_value = str(val)
        end = out.packet.add()
        end.timestamp = int(r.ts) + int(r.dur)
        end.trusted_packet_sequence_id = _SEQ
        end.track_event.type = TrackEvent.TYPE_SLICE_END
        end.track_event.track_uuid = track
    counters = memory[["rank", "track"]].drop_duplicates().reset_index(drop=True)
    uuid = {(int(r.rank), r.track): 3_000_000 + i for i, r in enumerate(
        counters.itertuples(index=False))}
    for (rank, track), u in uuid.items():
        pkt = out.packet.add()
        pkt.track_descriptor.uuid = u
        pkt.track_descriptor.parent_uuid = 1_000_000 + rank
        pkt.track_descriptor.name = track
        pkt.track_descriptor.counter.unit = pkt.track_descriptor.counter.UNIT_SIZE_BYTES
    for r in memory[["rank", "track", "ts", "bytes"]].itertuples(index=False):
        pkt = out.packet.add()
        pkt.timestamp = int(r.ts)
        pkt.trusted_packet_sequence_id = _SEQ
        pkt.track_event.type = TrackEvent.TYPE_COUNTER
        pkt.track_event.track_uuid = uuid[(int(r.rank), r.track)]
        pkt.track_event.counter_value = int(r.bytes)
    data: bytes = out.SerializeToString()
    return data


def write(trace: Trace, path: Path) -> Path:
    """Write a .pftrace file."""
    return write_atomic(path, build(trace))
