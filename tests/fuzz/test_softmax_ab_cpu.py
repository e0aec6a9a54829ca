"""The softmax A/B benchmark's CPU parts: every configuration and schedule plans on sm_90a, and the
documents configuration gets the suite's document ids."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from attngen.cuda.render import plan
from attngen.lang import frontend
from attngen.ir.nodes import TileHint
from attngen.plan.schedule import Arch, Engine, short_tile

import _benchmarks

ROOT = Path(__file__).resolve().parents[2]


def _load():
    return _benchmarks.load("softmax_ab")


def test_every_configuration_plans_every_schedule_it_times() -> None:
    ab = _load()
    for label, body in ab.CONFIGS:
        v = frontend.loads(f"attention {label} {{ {body} }}").get()
        for name, sm in ab.SCHEDULES:
            if name not in ab.ONLY_SCHEDULES.get(label, (name,)):
                continue
            planned = v
            if name in ab.RING_SCHEDULES:  # the short-loop kernel's split rings (L <= its max_lk)
                st = short_tile(v, Arch.SM90A)
                assert st is not None, (label, name)
                t = st.tile
                planned = dataclasses.replace(v, tile=TileHint(t.block_m, t.block_n, t.warps, t.stages))
            kp = plan(planned, Arch.SM90A, softmax=sm)
            assert kp.engine == Engine.WGMMA, (label, name)
            if sm is not None:
                assert kp.attention.softmax == sm, (label, name)  # no schedule silently turned off


def test_documents_take_the_suite_ids() -> None:
    ab = _load()
    body = dict(ab.CONFIGS)["d128_documents"]
    v = frontend.loads(f"attention d {{ {body} }}").get()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        rt = ab._runtime_inputs(v, 2, 1024, 1024)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert set(rt) == {"doc"} and rt["doc"].shape == (2, 1024)
    assert all((rt["doc"][b, 1:] >= rt["doc"][b, :-1]).all() and rt["doc"][b, -1] == 15 for b in range(2))
    plain = dict(ab.CONFIGS)["d128_causal"]
    assert ab._runtime_inputs(frontend.loads(f"attention c {{ {plain} }}").get(), 2, 1024, 1024) == {}
    preln = frontend.loads(f"attention p {{ {dict(ab.CONFIGS)['d64_preln_cross']} }}").get()
    assert ab.SHAPES["d64_preln_cross"] == (32, 2048, 512)
    assert set(ab._runtime_inputs(preln, 2, 64, 32)) == {"q_norm_weight", "q_norm_bias"}
    assert ab._peers(preln, {}) == {"torch-compile"} and ab._peers(preln, {"doc": None}) == {"flex"}
