"""Vectorised Murmur3 x86 32-bit (seed 0) over numpy arrays: 64-bit integers and ragged byte strings.

Every row is hashed independently, so the work is spread across rows: each mixing step is one numpy
operation over many rows at once. Integers are processed in cache-sized chunks with in-place operations
(no per-step allocations); byte strings are ordered by block count so that step `j` touches exactly the
rows that still have a `j`-th block, as one contiguous prefix. The scalar twin is `murmur3.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from airflow_partitions.transforms import murmur3

_C1 = np.uint32(murmur3.C1)
_C2 = np.uint32(murmur3.C2)
_N1 = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_FIVE = np.uint32(5)
# Rows per chunk for the integer kernel: eight uint32 work arrays of this size stay in L2 cache.
_CHUNK = 1 << 15
# Below this many rows still holding blocks, finishing those rows in Python beats per-step numpy overhead.
_SCALAR_TAIL_ROWS = 12
# Rows per chunk for byte strings: keeps each pass's scattered 4-byte reads mostly in cache.
_RAGGED_CHUNK = 1 << 17
_TAIL_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)

U32Array = npt.NDArray[np.uint32]


def _rotl_inplace(values: U32Array, shift: int, scratch: U32Array) -> None:
    np.right_shift(values, 32 - shift, out=scratch)
    np.left_shift(values, shift, out=values)
    np.bitwise_or(values, scratch, out=values)


def _scramble_inplace(block: U32Array, scratch: U32Array) -> None:
    """k *= c1; k = rotl(k, 15); k *= c2 — the per-block pre-mix, in place."""
    np.multiply(block, _C1, out=block)
    _rotl_inplace(block, 15, scratch)
    np.multiply(block, _C2, out=block)


def _fold_inplace(state: U32Array, block: U32Array, scratch: U32Array) -> None:
    """h ^= k; h = rotl(h, 13); h = h * 5 + n1 — fold a scrambled block into the state, in place."""
    np.bitwise_xor(state, block, out=state)
    _rotl_inplace(state, 13, scratch)
    np.multiply(state, _FIVE, out=state)
    np.add(state, _N1, out=state)


def _fmix_inplace(state: U32Array, scratch: U32Array) -> None:
    np.right_shift(state, 16, out=scratch)
    np.bitwise_xor(state, scratch, out=state)
    np.multiply(state, _F1, out=state)
    np.right_shift(state, 13, out=scratch)
    np.bitwise_xor(state, scratch, out=state)
    np.multiply(state, _F2, out=state)
    np.right_shift(state, 16, out=scratch)
    np.bitwise_xor(state, scratch, out=state)


def hash_int64(values: npt.NDArray[np.integer[Any]]) -> U32Array:
    """Unsigned Murmur3 of each value's 8 little-endian bytes (Iceberg `hashLong`), vectorised."""
    out = np.empty(len(values), dtype=np.uint32)
    _hash_int64_chunks(values, out, None)
    return out


def bucket_int64(
    values: npt.NDArray[np.integer[Any]], num_buckets: int, dtype: npt.DTypeLike
) -> npt.NDArray[Any]:
    """Iceberg buckets of 64-bit integers; hashing and `% N` happen chunk by chunk, while in cache."""
    out = np.empty(len(values), dtype=dtype)
    _hash_int64_chunks(values, out, num_buckets)
    return out


def _hash_int64_chunks(
    values: npt.NDArray[np.integer[Any]], out: npt.NDArray[Any], num_buckets: int | None
) -> None:
    words = np.ascontiguousarray(values).astype("<i8", copy=False).view("<u4").reshape(-1, 2)
    count = words.shape[0]
    size = min(_CHUNK, max(count, 1))
    state_buffer = np.empty(size, dtype=np.uint32)
    block = np.empty(size, dtype=np.uint32)
    scratch = np.empty(size, dtype=np.uint32)
    for start in range(0, count, _CHUNK):
        stop = min(start + _CHUNK, count)
        width = stop - start
        state = state_buffer[:width]
        blk = block[:width]
        tmp = scratch[:width]
        # First block: the state starts at the seed 0, so `h ^= k` is just `h = k`.
        np.copyto(state, words[start:stop, 0])
        _scramble_inplace(state, tmp)
        _rotl_inplace(state, 13, tmp)
        np.multiply(state, _FIVE, out=state)
        np.add(state, _N1, out=state)
        np.copyto(blk, words[start:stop, 1])
        _scramble_inplace(blk, tmp)
        _fold_inplace(state, blk, tmp)
        np.bitwise_xor(state, np.uint32(8), out=state)
        _fmix_inplace(state, tmp)
        if num_buckets is not None:
            np.bitwise_and(state, np.uint32(0x7FFFFFFF), out=state)
            np.remainder(state, np.uint32(num_buckets), out=state)
        out[start:stop] = state


def hash_ragged(data: npt.NDArray[np.uint8], starts: npt.NDArray[Any], lengths: npt.NDArray[Any]) -> U32Array:
    """Unsigned Murmur3 of each byte string `data[starts[i] : starts[i] + lengths[i]]`, vectorised."""
    count = len(starts)
    out = np.empty(count, dtype=np.uint32)
    if count == 0:
        return out
    starts = starts.astype(np.int64, copy=False)
    lengths = lengths.astype(np.int64, copy=False)
    low = int(starts.min())
    high = int((starts + lengths).max())
    # Copy only the referenced byte range, plus 4 zero bytes so every 4-byte read stays in bounds.
    padded = np.zeros(high - low + 4, dtype=np.uint8)
    padded[: high - low] = data[low:high]
    # Unaligned little-endian uint32 view: word i is the 4 bytes starting at byte i.
    words = np.ndarray(shape=(len(padded) - 3,), dtype="<u4", buffer=padded, strides=(1,))
    # Chunks of neighbouring rows keep each pass's scattered 4-byte reads inside the CPU cache.
    for first in range(0, count, _RAGGED_CHUNK):
        last = min(first + _RAGGED_CHUNK, count)
        out[first:last] = _hash_ragged_chunk(padded, words, starts[first:last] - low, lengths[first:last])
    return out


def _hash_ragged_chunk(
    padded: npt.NDArray[np.uint8],
    words: U32Array,
    positions: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
) -> U32Array:
    count = len(positions)
    block_counts = lengths >> 2
    most_blocks = int(block_counts.max())
    state = np.zeros(count, dtype=np.uint32)
    scratch = np.empty(count, dtype=np.uint32)
    if most_blocks > 0:
        # Rows ordered by block count, descending: the rows having a j-th block form a prefix.
        if most_blocks < 1 << 16:
            order = np.argsort((most_blocks - block_counts).astype(np.uint16), kind="stable")
        else:
            order = np.argsort(-block_counts, kind="stable")
        sorted_blocks = block_counts[order]
        sorted_positions = positions[order]
        per_count = np.bincount(sorted_blocks, minlength=most_blocks + 1)
        # rows_with_block[j] = number of rows having at least j + 1 blocks.
        rows_with_block = count - np.cumsum(per_count)[:-1]
        sorted_state = np.zeros(count, dtype=np.uint32)
        cursor = sorted_positions.copy()
        for block_index in range(most_blocks):
            active = int(rows_with_block[block_index])
            if active <= _SCALAR_TAIL_ROWS:
                _finish_blocks_in_python(
                    padded, sorted_positions, sorted_blocks, sorted_state, active, block_index
                )
                break
            block = words[cursor[:active]]
            tmp = scratch[:active]
            _scramble_inplace(block, tmp)
            _fold_inplace(sorted_state[:active], block, tmp)
            cursor[:active] += 4
        state[order] = sorted_state

    tail = words[positions + 4 * block_counts] & _TAIL_MASKS[lengths & 3]
    # A zero tail scrambles to zero and leaves the state unchanged, exactly like skipping it.
    _scramble_inplace(tail, scratch)
    np.bitwise_xor(state, tail, out=state)
    np.bitwise_xor(state, lengths.astype(np.uint32), out=state)
    _fmix_inplace(state, scratch)
    return state


def _finish_blocks_in_python(
    padded: npt.NDArray[np.uint8],
    positions: npt.NDArray[np.int64],
    block_counts: npt.NDArray[np.int64],
    state: U32Array,
    active: int,
    first_block: int,
) -> None:
    """Fold the remaining whole blocks of the few long rows left, one row at a time."""
    for row in range(active):
        start = int(positions[row])
        blocks = int(block_counts[row])
        raw = padded[start : start + 4 * blocks].tobytes()
        state[row] = murmur3.mix_blocks(int(state[row]), raw, first_block)


def bucket_of_hashes(hashes: U32Array, num_buckets: int, dtype: npt.DTypeLike) -> npt.NDArray[np.generic]:
    """Iceberg's `(hash & Integer.MAX_VALUE) % N` over unsigned hashes, cast to the result dtype."""
    np.bitwise_and(hashes, np.uint32(0x7FFFFFFF), out=hashes)
    np.remainder(hashes, np.uint32(num_buckets), out=hashes)
    return hashes.astype(dtype)
