"""A pytest plugin for experiments: `-p tools.pytest_wg_dq` with AG_WG_DQ=red2|red4|rows|tile|wg|wgbulk|wgtma runs
the tests with the wgmma backward's dQ reductions forced to that mode (plan_bwd.WG_DQ), e.g. the
GPU backward tests on a mode before it becomes the default. Loaded in every xdist worker too."""

from __future__ import annotations

import os


def pytest_configure(config) -> None:  # noqa: ARG001  (pytest's hook signature)
    mode = os.environ.get("AG_WG_DQ")
    if mode:
        from attngen.plan import bwd as plan_bwd

        plan_bwd.force_wg_dq(mode)
        print(f"pytest_wg_dq: wgmma backward dQ reductions forced to {mode}")
