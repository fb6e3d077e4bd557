"""q-grams hashed for open-addressing tables: the outputs' index (arena.py) and the store's ranges
(store_search.py) look a gram up by its FNV-1a hash and compare it where it occurs."""

from __future__ import annotations

import numba as nb


@nb.njit(cache=True)
def gram_hash(values, end, q, mask):
    h = 2166136261
    for i in range(end - q, end):
        h = ((h ^ (values[i] & 0xFFFFFFFF)) * 16777619) & 0xFFFFFFFF
    return h & mask


@nb.njit(cache=True)
def same_gram(arena, position, values, end, q):
    for i in range(q):
        if arena[position - q + i] != values[end - q + i]:
            return False
    return True
