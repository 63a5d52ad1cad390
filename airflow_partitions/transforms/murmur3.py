"""Murmur3 x86 32-bit (seed 0) in plain Python: the scalar half of the Iceberg bucket hash.

The vectorised half lives in `arrow_hash.py`; both implement the same mixing steps, and the tests check
them against each other, against the `mmh3` package and against the Iceberg spec's vectors. Only the
standard library is used so that scalar evaluation (pruning a literal) needs neither numpy nor pyarrow.
"""

from __future__ import annotations

import struct

C1 = 0xCC9E2D51
C2 = 0x1B873593
MASK32 = 0xFFFFFFFF


def _rotl32(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (32 - shift))) & MASK32


def mix_block(state: int, block: int) -> int:
    """One body step: fold the 4-byte little-endian `block` into the running hash `state`."""
    block = (block * C1) & MASK32
    block = _rotl32(block, 15)
    block = (block * C2) & MASK32
    state ^= block
    state = _rotl32(state, 13)
    return (state * 5 + 0xE6546B64) & MASK32


def mix_tail(state: int, tail: bytes) -> int:
    """Fold the last 0-3 bytes (little-endian) into `state`; an empty tail leaves it unchanged."""
    block = int.from_bytes(tail, "little")
    block = (block * C1) & MASK32
    block = _rotl32(block, 15)
    block = (block * C2) & MASK32
    return state ^ block


def finalize(state: int, length: int) -> int:
    """Length fold and avalanche (`fmix32`); returns the unsigned 32-bit hash."""
    state ^= length & MASK32
    state ^= state >> 16
    state = (state * 0x85EBCA6B) & MASK32
    state ^= state >> 13
    state = (state * 0xC2B2AE35) & MASK32
    return state ^ (state >> 16)


def mix_blocks(state: int, data: bytes, first_block: int = 0) -> int:
    """Fold the whole 4-byte blocks of `data`, starting at block index `first_block`, into `state`."""
    block_count = len(data) // 4
    if first_block >= block_count:
        return state
    for block in struct.unpack_from(f"<{block_count - first_block}I", data, 4 * first_block):
        state = mix_block(state, block)
    return state


def hash_bytes_unsigned(data: bytes) -> int:
    """Murmur3 x86_32 of `data` with seed 0, as an unsigned 32-bit integer."""
    state = mix_blocks(0, data)
    state = mix_tail(state, data[len(data) - len(data) % 4 :])
    return finalize(state, len(data))


def hash_bytes(data: bytes) -> int:
    """Murmur3 x86_32 of `data` with seed 0, as a signed 32-bit integer (Java's and Iceberg's view)."""
    unsigned = hash_bytes_unsigned(data)
    return unsigned - (1 << 32) if unsigned & 0x80000000 else unsigned


def hash_long(value: int) -> int:
    """Iceberg `hashLong`: the hash of `value` as 8 little-endian two's-complement bytes."""
    return hash_bytes(struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF))
