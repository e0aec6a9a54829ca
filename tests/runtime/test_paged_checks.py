"""The decode runtime's paged-cache checks before launch (CPU: they reduce whatever array type
they are given, NumPy here, CuPy or torch on a GPU): page ids in [0, num_pages), cache_lens in
[Lq, capacity], refused with the range and the values."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.runtime.decode import _check_pages


def test_good_tables_and_lengths_pass_at_the_edges() -> None:
    _check_pages(np.arange(8).reshape(2, 4), 8, np.array([4, 64], dtype=np.int32), 4, 64)
    _check_pages(np.arange(8).reshape(2, 4), 8, np.array([1, 1], dtype=np.int32), 1, 64)


@pytest.mark.parametrize("lens,msg", [
    ([3, 64], r"cache_lens: expected each row's cached tokens, the Lq = 4 new ones included, in \[4, 64\] "
              r"\(max_pages \* page_size\), got values from 3 to 64"),
    ([4, 65], r"in \[4, 64\] \(max_pages \* page_size\), got values from 4 to 65"),
    ([-1, 0], r"got values from -1 to 0"),
])
def test_lengths_outside_lq_to_capacity_are_refused(lens, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        _check_pages(np.arange(8).reshape(2, 4), 8, np.array(lens, dtype=np.int32), 4, 64)


def test_page_ids_are_still_checked_first() -> None:
    with pytest.raises(ValueError, match=r"block_table: expected page ids in \[0, 8\), got values from 0 to 8"):
        _check_pages(np.arange(1, 9).reshape(2, 4) - np.array([1, 0]).reshape(2, 1), 8, np.array([4, 4]), 4, 64)
