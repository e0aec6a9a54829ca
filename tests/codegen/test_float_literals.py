"""Float literals reach C++ as the fp32 constants every backend (and the reference) computes with."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attngen.ir.nodes import FP32_MAX, fp32_literal
from attngen.cuda.emit import float_literal


@pytest.mark.parametrize(
    "value,text",
    [
        (30.0, "30.0f"),
        (1e-5, "1e-05f"),
        (0.1, "0.1f"),
        (0.08838834764831845, "0.088388346f"),  # 1 / sqrt(128): the shortest text of its fp32
        (2.5000000000000004, "2.5f"),  # rounds to 2.5 in fp32
        (1e-50, "0.0f"),  # below fp32's range: 0, as in the reference (NVRTC rejects `1e-50f`)
        (1.401298464324817e-45, "0.0f"),  # fp32 subnormals are flushed, as fast-math kernels do
        (3.4028234663852886e38, "3.4028235e+38f"),
    ],
)
def test_float_literal_text(value: float, text: str) -> None:
    assert float_literal(value) == text


def test_beyond_fp32_never_reaches_code() -> None:
    with pytest.raises(ValueError, match="not a finite fp32"):
        float_literal(1e39)


@given(st.floats(min_value=-FP32_MAX, max_value=FP32_MAX, allow_nan=False))
def test_the_text_reads_back_as_the_fp32_constant(x: float) -> None:
    text = float_literal(x)
    assert text.endswith("f") and ("." in text or "e" in text)
    back = struct.unpack("<f", struct.pack("<f", float(text[:-1])))[0]
    assert back == fp32_literal(x)
