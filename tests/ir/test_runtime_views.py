"""CPU-side helpers of the runtime (no GPU needed): byte ranges and overlap of array views."""

from __future__ import annotations

from attngen.runtime.binder import ArrayView as _Arr, byte_range as _byte_range, overlaps as _overlaps


def view(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int = 2) -> _Arr:
    return _Arr(None, ptr, shape, strides, "float16", itemsize, 0, False)


def test_byte_range_of_contiguous_and_strided_views() -> None:
    assert _byte_range(view(1000, (2, 3), (3, 1))) == (1000, 1012)
    # every other row of a [4, 8] array: rows 0 and 2 → last element at 2*16 + 7
    assert _byte_range(view(0, (2, 8), (16, 1))) == (0, (16 + 7 + 1) * 2)
    assert _byte_range(view(64, (0, 8), (8, 1))) == (64, 64)
    # a negative stride reaches below the pointer
    assert _byte_range(view(100, (3,), (-1,), itemsize=4)) == (92, 104)


def test_overlap_detects_aliasing_and_accepts_disjoint_buffers() -> None:
    q = view(0, (1, 4, 2, 8), (64, 16, 8, 1))
    out_same = view(0, (1, 4, 2, 8), (64, 16, 8, 1))
    out_inside = view(64, (1, 1, 2, 8), (64, 16, 8, 1))
    out_after = view(128, (1, 4, 2, 8), (64, 16, 8, 1))
    assert _overlaps(q, out_same) and _overlaps(out_inside, q)
    assert not _overlaps(q, out_after) and not _overlaps(out_after, q)
