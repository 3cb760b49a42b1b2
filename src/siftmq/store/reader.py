"""The read path of getMessage: an index pass over ConsumeQueue entries, then the records it keeps.

:meth:`MessageReader.get_messages` answers one pull of one queue as RocketMQ's ``getMessage``
does for a master broker: a block of index entries is read, the filter's index stage picks the
candidates (tags codes or bitmaps, vectorized with numpy, without touching the CommitLog), and the
candidates' records are read — sliced from the segment's read map, or runs of nearby ones with one
``pread`` — and checked by the filter's exact stage while decoding. A damaged record, or the
filler entry of one lost to damage, is passed over and counted, so one bad record never stops a
queue. Takes no lock: CommitLog reads are positional and the index is append-only.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import numpy as np

from siftmq.errors import CorruptRecordError
from siftmq.slots import frozen_slots_constructor
from siftmq.store import decoding
from siftmq.store.codec import StoredMessage
from siftmq.store.commitlog import MISSING_SEGMENT, CommitLog
from siftmq.store.config import StoreConfig
from siftmq.store.consumequeue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from siftmq.store.filtering import GetMessageResult, GetMessageStatus, MessageFilter
from siftmq.store.segment import Segment

_log = logging.getLogger(__name__)

_MAX_FILTER_BYTES: Final = 16000  # RocketMQ: index bytes scanned per getMessage at least
_READ_GAP: Final = 16 * 1024  # candidates at most this far apart are read with one pread (a copy is cheaper)
_READ_SPAN: Final = 256 * 1024  # most bytes read at once for a run of candidates
_CANDIDATE_CHUNK: Final = 64  # index candidates converted to Python ints at once (more if needed)
_DAMAGE_LOG_INTERVAL_S: Final = 1.0  # at most one log line a second about damaged records

_make_result: Final = frozen_slots_constructor(GetMessageResult)


def _new_result(  # noqa: PLR0917 - the fields, in order
    status: GetMessageStatus,
    next_begin_offset: int,
    min_offset: int,
    max_offset: int,
    messages: list[StoredMessage],
    scanned: int,
) -> GetMessageResult:
    """``GetMessageResult(...)`` minus the frozen ``__init__`` (see ``siftmq.slots``)."""
    return _make_result((status, next_begin_offset, min_offset, max_offset, messages, scanned))


class MessageReader:
    """Reads messages of one store's queues (thread-safe; counts the damaged records it passes)."""

    def __init__(self, commit_log: CommitLog, config: StoreConfig) -> None:
        self.commit_log = commit_log
        self.config = config
        #: records passed over because they are damaged
        self.damaged_reads = 0
        self._damage_logged_at = -1.0

    def get_messages(
        self,
        cq: ConsumeQueue | None,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None,
        *,
        raw: bool = False,
        max_bytes: int | None = None,
        hold_one: bool = True,
    ) -> GetMessageResult:
        """Up to ``max_count`` messages of ``cq`` from ``offset`` (see ``MessageStore.get_messages``);
        with ``raw``, the result's ``messages`` are :class:`~siftmq.store.decoding.RawRecord`
        (see ``MessageStore.get_records``)."""
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_offset = cq.min_offset
        max_offset = cq.max_offset
        S = GetMessageStatus
        if max_offset == 0:
            return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
        if offset < min_offset:
            return GetMessageResult(S.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return GetMessageResult(S.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            nxt = min_offset if min_offset == 0 else max_offset
            return GetMessageResult(S.OFFSET_OVERFLOW_BADLY, nxt, min_offset, max_offset)
        max_entries = max(_MAX_FILTER_BYTES, max_count * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
        entries = cq.read_block(offset, min(max_entries, max_offset - offset))
        if entries is None or len(entries) == 0:
            return GetMessageResult(S.OFFSET_FOUND_NULL, cq.roll_next_file(offset), min_offset, max_offset)
        return self._scan(
            cq,
            entries,
            offset,
            max_count,
            message_filter,
            bounds=(min_offset, max_offset),
            raw=raw,
            max_bytes=self.config.max_transfer_bytes if max_bytes is None else max_bytes,
            strict=not hold_one,
        )

    def _scan(
        self,
        cq: ConsumeQueue,
        entries: np.ndarray,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None,
        *,
        bounds: tuple[int, int],
        raw: bool,
        max_bytes: int,
        strict: bool,
    ) -> GetMessageResult:
        """Read the records of the index candidates: each sliced from its segment's read map, or
        (not mapped yet) runs of nearby ones with one pread each. ``strict``: even the first
        message must fit ``max_bytes``."""
        min_offset, max_offset = bounds
        n = len(entries)
        candidates = self._index_candidates(cq, entries, offset, message_filter)
        count = len(candidates)
        if count == 0:
            return _new_result(GetMessageStatus.NO_MATCHED_MESSAGE, offset + n, min_offset, max_offset, [], n)
        accept = message_filter.is_matched_by_commit_log if message_filter is not None else None
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        found = GetMessageStatus.FOUND
        messages: list[Any] = []  # StoredMessage; RawRecord when raw
        total = 0
        next_phy_file_start = -1
        scanned = n
        removing_at = -1
        exact_rejected = 0  # candidates the filter's exact stage turned down
        max_msgs = min(max_count, self.config.max_transfer_count)
        commit_log = self.commit_log
        segment_size = commit_log.segment_size
        max_record_size = commit_log.max_record_size
        decode = decoding.split_entry if raw else decoding.decode_entry
        topic, queue_id = cq.topic, cq.queue_id
        topic_bytes = topic.encode()
        seg: Segment | None = None  # the segment of the previous candidate
        seg_start = seg_end = 0
        span = b""  # the bytes of [span_start, span_end) of the CommitLog
        span_start = span_end = 0
        # candidates as Python ints, a chunk at a time (an unfiltered pull needs only the first few)
        chunk = count if count <= _CANDIDATE_CHUNK else max(_CANDIDATE_CHUNK, 2 * max_msgs)
        done = 0
        while done < count:
            chunk_index: list[int] = candidates[done : done + chunk].tolist()
            chunk_rows: list[tuple[int, int, int]] = entries[candidates[done : done + chunk]].tolist()
            done += len(chunk_index)
            chunk = _CANDIDATE_CHUNK * 4
            stop = False
            count_here = len(chunk_index)
            for j in range(count_here):
                idx = chunk_index[j]
                phy, size, _tags_code = chunk_rows[j]
                if phy < next_phy_file_start:
                    continue
                # (an implausible size is a damaged entry, passed over below, never one that does not fit)
                if (messages or strict) and (
                    len(messages) >= max_msgs or (total + size > max_bytes and 0 < size <= max_record_size)
                ):
                    scanned = idx
                    stop = True
                    break
                plausible = 0 < size <= max_record_size
                data = None
                if plausible:
                    if not seg_start <= phy < seg_end:
                        seg = commit_log.segment_holding(phy)
                        if seg is not None:
                            seg_start = seg.start_offset
                            seg_end = seg_start + seg.capacity
                    if seg is not None and phy - seg_start + size <= seg.length:
                        data = seg.read_mapped(phy - seg_start, size)
                if data is not None:
                    buf, at = data, 0
                else:
                    if not plausible or phy < span_start or phy + size > span_end:
                        # read this record and the following candidates that are close by, at once
                        end = phy + size if plausible else phy + 1
                        segment_end = phy - phy % segment_size + segment_size
                        k = j + 1
                        while plausible and k < count_here:
                            nxt, nxt_size, _ = chunk_rows[k]
                            nxt_end = nxt + nxt_size
                            span_limit = min(segment_end, phy + _READ_SPAN, nxt + max_record_size)
                            if not end <= nxt < nxt_end <= span_limit:
                                break
                            if nxt - end > _READ_GAP:
                                break
                            end = nxt_end
                            k += 1
                        read = commit_log.read_range(phy, end - phy)
                        if read is None and phy >= commit_log.min_offset:
                            # not removed by retention (it removes whole segments from the front):
                            # a record in a segment file that is missing, or an entry pointing past
                            # the log's end (damaged itself); it alone is passed over, not the rest
                            # of the block behind it
                            why = (
                                MISSING_SEGMENT
                                if commit_log.is_missing(phy)
                                else "index entry past the commit log"
                            )
                            self._skip_damaged(cq, offset + idx, phy, why)
                            continue
                        if read is None:
                            if not messages:
                                status = GetMessageStatus.MESSAGE_WAS_REMOVING
                                removing_at = idx
                            next_phy_file_start = commit_log.roll_next_file(phy)
                            continue
                        if not plausible:  # a filler for a record lost to damage, or a damaged entry
                            self._skip_damaged(cq, offset + idx, phy, f"index entry of size {size}")
                            continue
                        span, span_start, span_end = read, phy, phy + len(read)
                    buf, at = span, phy - span_start
                try:
                    msg = decode(
                        buf,
                        at,
                        phy,
                        size,
                        max_record_size,
                        topic,
                        topic_bytes,
                        queue_id,
                        offset + idx,
                        accept,
                    )
                except CorruptRecordError as exc:
                    self._skip_damaged(cq, offset + idx, phy, str(exc))
                    continue
                if msg is None:  # rejected by the exact (CommitLog) stage of the filter
                    exact_rejected += 1
                    continue
                messages.append(msg)
                total += size
                status = found
                next_phy_file_start = -1
            if stop:
                break
        if accept is not None and (messages or exact_rejected):
            tally = getattr(message_filter, "tally_exact", None)
            if tally is not None:
                tally(len(messages) + exact_rejected, len(messages))
        if status is GetMessageStatus.MESSAGE_WAS_REMOVING and count < n:
            # RocketMQ flips to NO_MATCHED_MESSAGE when an index-rejected entry follows
            rejected = np.ones(n, dtype=bool)
            rejected[candidates] = False
            if rejected[removing_at + 1 : scanned].any():
                status = GetMessageStatus.NO_MATCHED_MESSAGE
        return _new_result(status, offset + scanned, min_offset, max_offset, messages, scanned)

    def decode_raw(self, cq: ConsumeQueue, record: decoding.RawRecord) -> StoredMessage | None:
        """The message of a record :meth:`get_messages` gave raw; None when it is damaged (passed
        over and counted, as a read does)."""
        try:
            return decoding.decode_raw(record, self.commit_log.max_record_size, cq.topic, cq.queue_id)
        except CorruptRecordError as exc:
            self._skip_damaged(cq, record.queue_offset, record.commit_log_offset, str(exc))
            return None

    def _skip_damaged(self, cq: ConsumeQueue, queue_offset: int, phy: int, reason: str) -> None:
        """Pass over a record that cannot be read intact: it is counted and logged (at most once a
        second), and the read goes on with the next one, so one bad record never stops a queue."""
        self.damaged_reads += 1
        now = time.monotonic()
        if now - self._damage_logged_at >= _DAMAGE_LOG_INTERVAL_S:
            self._damage_logged_at = now
            _log.error(
                "skipped the damaged record of %s:%d at queue offset %d (commit log offset %d): %s; "
                "%d damaged reads so far (siftmq store check lists the damaged ranges)",
                cq.topic,
                cq.queue_id,
                queue_offset,
                phy,
                reason,
                self.damaged_reads,
            )

    def _index_candidates(
        self, cq: ConsumeQueue, entries: np.ndarray, offset: int, message_filter: MessageFilter | None
    ) -> np.ndarray:
        n = len(entries)
        if message_filter is None:
            return np.arange(n)
        tags_codes = entries["tags_code"].astype(np.int64)
        # what isinstance(message_filter, BlockMessageFilter) checks, without its cost per call
        match_block = getattr(message_filter, "match_consume_queue_block", None)
        if match_block is not None:
            lazy_ext = cq.ext.lazy_block(offset, n) if cq.ext is not None else None
            mask = match_block(tags_codes, lazy_ext)
            if type(mask) is not np.ndarray or mask.dtype != np.bool_:
                mask = np.asarray(mask, dtype=bool)
            if mask.shape != (n,):
                raise ValueError(f"match_consume_queue_block returned shape {mask.shape}, expected ({n},)")
            found: np.ndarray = mask.nonzero()[0]
            return found
        ext_block = cq.ext.read_block(offset, n) if cq.ext is not None else None
        have_ext = 0 if ext_block is None else len(ext_block.present)
        keep = [
            i
            for i in range(n)
            if message_filter.is_matched_by_consume_queue(
                int(tags_codes[i]), ext_block.unit(i) if ext_block is not None and i < have_ext else None
            )
        ]
        return np.asarray(keep, dtype=np.int64)
