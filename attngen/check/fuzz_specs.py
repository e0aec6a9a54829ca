"""`attngen fuzz --specs`: the compiler fuzzed with generated valid spec text (it must load,
print and reload equal, and verify on random shapes) and mutated spec text (only success or a
`SpecError`, never a traceback); with nvcc, every accepted spec must also compile."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attngen.check.fuzz_cases import case_inputs, case_strategy
from attngen.check.fuzz_driver import drive
from attngen.check.fuzz_report import Outcome, Progress, fmt_exc
from attngen.check.fuzz_run import compare, reference_invariants, run_kernel
from attngen.ir.nodes import ATTENTION_DTYPES, DType
from attngen.lang.builtins import FuzzContext, fuzz_forms


def spec_strategy(name: str = "fuzzed"):
    """Random valid spec text: one variant drawing dtype, dims, heads, kind, layout, scale, a mask
    built from builtins and custom expressions, score modifications, norms, residual, nan_check,
    LSE and tile; the inputs each construct needs are declared. Returns (text, description)."""
    from hypothesis import strategies as st

    # The steps draw in a fixed order (shape, mask, scores, norms and flags, then the constructs
    # added later): changing the order changes every seed's examples (and CI's).
    @st.composite
    def build(draw) -> str:
        sp = _draw_shape(draw, st)
        ctx = FuzzContext(draw, st, sp.fresh, sp.inputs, sp.kind)
        mask = _draw_mask(sp, ctx)
        if mask:
            sp.lines.append(f"mask {mask}")
        for _ in range(draw(st.integers(0, 2))):
            sp.lines.append(f"score {_draw_score(sp, ctx)}")
        _draw_norms_and_flags(sp)
        _draw_later_constructs(sp)
        _draw_quant(sp)
        lines = sp.lines
        body = "\n".join(f"  {x}" for x in lines[:5] + sp.inputs + lines[5:])
        return f"attention {name} {{\n{body}\n}}\n"

    return build()


@dataclass
class _SpecDraft:
    """A spec being drawn: its statement lines (the first five are dtype, head_dim, heads, kind and
    layout, in that order), the inputs its constructs declare and the names they took."""

    draw: Any
    st: Any
    dtype: str
    D: int
    Dv: int
    kind: str
    layout: str
    lines: list[str]
    inputs: list[str] = field(default_factory=list)
    used_names: set[str] = field(default_factory=set)

    def fresh(self, base: str) -> str:
        """`base` with the first number that makes it a name not yet taken."""
        i = 0
        while f"{base}{i}" in self.used_names:
            i += 1
        self.used_names.add(f"{base}{i}")
        return f"{base}{i}"


def _draw_shape(draw: Any, st: Any) -> _SpecDraft:
    """dtype, head dims, heads, kind, layout and scale."""
    from attngen.plan.schedule import SUPPORTED_HEAD_DIMS

    dtype = draw(st.sampled_from([d.value for d in ATTENTION_DTYPES]))
    D = draw(st.sampled_from(SUPPORTED_HEAD_DIMS))
    Dv = D
    if draw(st.integers(0, 5)) == 0:
        Dv = draw(st.sampled_from(SUPPORTED_HEAD_DIMS))
    ratio = draw(st.sampled_from([1, 2, 4, 8]))
    Hkv = draw(st.sampled_from([1, 2]))
    H = ratio * Hkv
    kind = draw(st.sampled_from(["self", "cross"]))
    layout = draw(st.sampled_from(["bhsd", "bshd"]))
    lines = [f"dtype {dtype}", f"head_dim {D}" + (f" value {Dv}" if Dv != D else ""),
             f"heads {H}" + (f" kv {Hkv}" if Hkv != H else ""), f"kind {kind}", f"layout {layout}"]
    scale = draw(st.sampled_from(["auto", "auto", "0.125", "0.05", "1.0", "0.3"]))
    if scale != "auto" or draw(st.booleans()):
        lines.append(f"scale {scale}")
    return _SpecDraft(draw, st, dtype, D, Dv, kind, layout, lines)


def _draw_mask(sp: _SpecDraft, ctx: FuzzContext) -> str:
    """Up to three atoms joined by && and ||; "" for no mask. Each builtin's forms come from its
    declaration (attngen.lang.builtins), in declaration order, then custom expressions; the order
    keeps the draws (and CI's examples) as before."""
    draw, st = sp.draw, sp.st
    builtin_masks = fuzz_forms(score=False)

    def mask_atom() -> str:
        choice = draw(st.sampled_from([*builtin_masks, "dilated", "keep", "block_causal", "band"]))
        if choice in builtin_masks:
            return builtin_masks[choice](ctx)
        if choice == "dilated":
            return f"(q - kv) % {draw(st.integers(2, 5))} == 0"
        if choice == "keep":
            n = sp.fresh("keep")
            sp.inputs.append(f"input {n}: u8[B, Lk]")
            return f"{n}[b, kv] != 0"
        if choice == "block_causal":
            blk = draw(st.sampled_from([16, 64, 100]))
            return f"q / {blk} >= kv / {blk}"
        return f"kv >= q - {draw(st.integers(0, 64))} && kv <= q + {draw(st.integers(0, 64))}"

    n_atoms = draw(st.integers(0, 3))
    mask = ""
    for i in range(n_atoms):
        atom = mask_atom()
        if atom == "padding" and "padding" in mask:
            atom = "causal"
        if draw(st.integers(0, 6)) == 0:
            atom = f"!({atom})"
        elif " " in atom and not atom.startswith("("):
            atom = f"({atom})"
        mask = atom if not mask else f"{mask} {draw(st.sampled_from(['&&', '&&', '||']))} {atom}"
    return mask


def _draw_score(sp: _SpecDraft, ctx: FuzzContext) -> str:
    """One score modification: a builtin's form or a custom expression of `s`."""
    draw, st = sp.draw, sp.st
    builtin_scores = fuzz_forms(score=True)
    choice = draw(st.sampled_from([*builtin_scores, "scale_s", "min_s", "where_s", "tanh_s"]))
    if choice in builtin_scores:
        return builtin_scores[choice](ctx)
    if choice == "scale_s":
        return f"s * {draw(st.sampled_from(['0.5', '2.0', '1.5']))}"
    if choice == "min_s":
        return f"min(s, {draw(st.sampled_from(['4.0', '0.0', '10.0']))})"
    if choice == "where_s":
        return "where(kv % 2 == 0, s, s - 1.0)"
    return "tanh(s) * 3.0"


def _draw_norms_and_flags(sp: _SpecDraft) -> None:
    """Norms of q, k and o, residual, nan_check, the LSE output and a tile hint the arch takes."""
    from attngen.ir.nodes import TileConfig
    from attngen.plan.schedule import validate_tile

    draw, st, lines = sp.draw, sp.st, sp.lines
    eps = draw(st.sampled_from(["1e-5", "1e-6"]))
    qn = draw(st.sampled_from(["none", "none", "head", "token"]))
    if qn == "token" and sp.layout != "bshd":
        qn = "head"
    if qn != "none":
        kind_n = draw(st.sampled_from(["layernorm", "rmsnorm"]))
        aff = "" if draw(st.integers(0, 3)) else " affine false"
        lines.append(f"norm q {kind_n}({eps}) scope {qn}{aff}")
    if draw(st.integers(0, 3)) == 0:
        kind_n = draw(st.sampled_from(["layernorm", "rmsnorm"]))
        lines.append(f"norm k {kind_n}({eps}) scope head")
    if draw(st.integers(0, 4)) == 0:
        kind_n = draw(st.sampled_from(["layernorm", "rmsnorm"]))
        lines.append(f"norm o {kind_n}({eps})")
    if sp.Dv == sp.D and draw(st.integers(0, 3)) == 0:
        lines.append("residual")
    if draw(st.integers(0, 4)) == 0:
        lines.append("nan_check")
    if draw(st.booleans()):
        lines.append("output lse")
    if draw(st.booleans()):
        dt = DType(sp.dtype)
        bm = draw(st.sampled_from([16, 32, 64, 128]))
        bn = draw(st.sampled_from([16, 32, 64, 128]))
        warps = draw(st.sampled_from([1, 2, 4, 8]))
        stages = draw(st.integers(1, 3))
        t = TileConfig(bm, bn, warps, stages)
        if not validate_tile(dt, sp.D, sp.Dv, t):
            lines.append(f"tile block_m {bm} block_n {bn} warps {warps} stages {stages}")


def _draw_later_constructs(sp: _SpecDraft) -> None:
    """Sinks, paged caches, the wide head dims and `layout varlen`: drawn after everything else
    so that the draws before them (and the CI examples they give) stay as they were."""
    from attngen.plan.schedule import WIDE_HEAD_DIMS

    draw, st, lines, inputs, dtype = sp.draw, sp.st, sp.lines, sp.inputs, sp.dtype
    if draw(st.integers(0, 5)) == 0:
        n = sp.fresh("sinks")
        inputs.append(f"input {n}: fp32[H]")
        lines.append(f"sink {n}")
    decodable = (dtype != "fp32" and sp.D == sp.Dv and sp.D in (64, 128) and not any(x.startswith(("norm", "residual")) for x in lines)
                 and not any(i.endswith(" sorted") for i in inputs))  # the decode family checks no `sorted` promise
    if sp.kind == "cross" and decodable and draw(st.integers(0, 3)) == 0:
        lines.append(f"kv_cache paged({draw(st.sampled_from([8, 16, 64, 256]))})")
    # The wide head dims (tensor-core dtypes only) replace the drawn pair where nothing drawn
    # refuses them (a token-scope q norm, a residual at Dv != D, a paged cache), and any tile hint,
    # which was validated for the narrow pair.
    wide = False
    if dtype != "fp32" and not any(x.startswith(("kv_cache", "residual")) or "scope token" in x for x in lines) \
            and draw(st.integers(0, 7)) == 0:
        D, Dv = draw(st.sampled_from(WIDE_HEAD_DIMS))
        lines[1] = f"head_dim {D}" + (f" value {Dv}" if Dv != D else "")
        lines[:] = [x for x in lines if not x.startswith("tile ")]
        wide = True
    # `layout varlen` where nothing in the spec refuses it (norms, paged caches, inputs sized by Lq
    # or Lk: positions restart in every packed sequence), and not with the wide head dims (their
    # tiles were sized for the dense kernel's registers).
    packable = not wide and not any(x.startswith(("norm", "kv_cache")) for x in lines) and not any(
        re.search(r"\bL[qk]\b", x) for x in inputs)
    if packable and draw(st.integers(0, 5)) == 0:
        lines[4] = "layout varlen"


def _draw_quant(sp: _SpecDraft) -> None:
    """`quant` statements (docs/QUANT.md), drawn last so that every earlier draw stays as it was:
    Q·Kᵀ quantized in the kernel (per token or per block of 16, k maybe smoothed), maybe P·V too;
    or, for a paged cache, fp8 pages with per-head, per-page or per-tensor scales."""
    draw, st, lines = sp.draw, sp.st, sp.lines
    if lines[4] == "layout varlen" or draw(st.integers(0, 5)) != 0:
        return
    paged = any(x.startswith("kv_cache") for x in lines)
    types = ["i8", "fp8_e4m3", "fp8_e5m2"]
    if paged:
        t = draw(st.sampled_from(types[1:]))
        lines[0] = f"dtype {sp.dtype} k {t} v {t}"
        lines.append(f"quant k {t} input per {draw(st.sampled_from(['head', 'page', 'tensor']))}")
        lines.append(f"quant v {t} input per {draw(st.sampled_from(['head', 'page', 'tensor']))}")
        return
    t = draw(st.sampled_from(types))
    gran = draw(st.sampled_from(["token", "block(16)"]))
    plain = not any(x.startswith(("score", "output lse", "sink")) for x in lines)
    smooth = " smooth mean" if plain and draw(st.booleans()) else ""
    lines.append(f"quant q {t} amax per {gran}")
    lines.append(f"quant k {t} amax per {draw(st.sampled_from(['token', 'block(16)']))}{smooth}")
    if draw(st.booleans()):
        tv = draw(st.sampled_from(types))
        lines.append(f"quant v {tv} amax per channel")
        lines.append(f"quant p {tv} " + draw(st.sampled_from([f"static({'127.0' if tv == 'i8' else '448.0'})", "amax per token"])))


# Tokens a mutation may insert: keywords, builtins, punctuation, odd numbers and names, junk.
MUTATION_TOKENS = (
    "attention", "dtype", "head_dim", "heads", "kv", "kind", "layout", "scale", "input", "mask", "score", "norm",
    "residual", "nan_check", "output", "tile", "auto", "block_m", "block_n", "warps", "stages", "value", "sorted",
    "scope", "affine", "causal", "window", "padding", "document", "prefix", "block_sparse", "softcap", "alibi",
    "bias", "rel_bias", "tanh", "exp", "log", "sqrt", "abs", "min", "max", "where", "s", "q", "kv", "b", "h",
    "B", "H", "Hkv", "Lq", "Lk", "D", "Dv", *(d.value for d in DType), "bhsd", "bshd", "self", "cross",
    "layernorm", "rmsnorm", "head", "token", "lse", "true", "false", "{", "}", "(", ")", "[", "]", ";", ",", ":",
    "&&", "||", "!", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "0", "-1", "1", "7", "16", "3.5",
    "1e999", "1e-999", "99999999999999999999999999", "2147483648", "0.0", "nan", "inf", "1.2.3", "12x8", "0x10",
    "__import__", "os", "#", "\n", "\t", "é", "∞", "\x00", '"', "'", "/*", "*/", "\\", "`", "$", "@",
    "((((((((((((((((((((", "))))))))))))", "q_lens", "kv_lens", "q_norm_weight", "attention x {", "}}",
    "sink", "kv_cache", "paged", "paged(16)", "block_table",
    # Hostile values (issue 19): names on the mangling's reserved suffixes, values fp32 flushes to
    # 0, heads past the grid, an over-long literal, odd line breaks.
    "x_n0", "q_lens_n0", "q_norm_weight_s0", "a_launch", "1e-50", "1e-45", "65536", "0" * 300 + "8", "\r", "\f",
    "\u2028", "t[t[t[t[t[kv]]]]]",
    "varlen", "layout varlen", "cu_seqlens", "cu_seqlens_q",
)


def mutate(text: str, rng: np.random.Generator) -> str:
    """1–4 random edits of spec text: deletions, duplications, insertions of tokens, number swaps,
    line swaps, truncation."""
    for _ in range(int(rng.integers(1, 5))):
        n = len(text)
        op = int(rng.integers(0, 7))
        if n == 0:
            op = 2
        if op == 0:  # delete a span
            i = int(rng.integers(0, n))
            j = min(n, i + int(rng.integers(1, 12)))
            text = text[:i] + text[j:]
        elif op == 1:  # duplicate a span
            i = int(rng.integers(0, n))
            j = min(n, i + int(rng.integers(1, 30)))
            text = text[:j] + text[i:j] + text[j:]
        elif op == 2:  # insert a token
            i = int(rng.integers(0, n + 1))
            tok = MUTATION_TOKENS[int(rng.integers(0, len(MUTATION_TOKENS)))]
            text = text[:i] + " " + tok + " " + text[i:]
        elif op == 3:  # replace a number
            import re

            nums = list(re.finditer(r"\d+(\.\d+)?", text))
            if nums:
                m = nums[int(rng.integers(0, len(nums)))]
                rep = ["0", "-1", "1e999", "3", "17", "256", "4096", "99999999999", "0.0", "-0.5", "1e-9"][
                    int(rng.integers(0, 11))]
                text = text[: m.start()] + rep + text[m.end():]
        elif op == 4:  # swap two lines
            lines = text.split("\n")
            if len(lines) > 2:
                a, b = (int(x) for x in rng.integers(0, len(lines), size=2))
                lines[a], lines[b] = lines[b], lines[a]
                text = "\n".join(lines)
        elif op == 5:  # truncate
            text = text[: int(rng.integers(0, n + 1))]
        else:  # replace a word by another token
            import re

            words = list(re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", text))
            if words:
                m = words[int(rng.integers(0, len(words)))]
                tok = MUTATION_TOKENS[int(rng.integers(0, len(MUTATION_TOKENS)))]
                text = text[: m.start()] + tok + text[m.end():]
    return text


def check_front_end(text: str) -> tuple[Any | None, str | None]:
    """Load text: (Program, None) on success, (None, None) on a SpecError with a located or plain
    rendered message, (None, problem) for anything else (a traceback would reach the user)."""
    from attngen.lang.diagnostics import SpecError
    from attngen.plan import validate

    try:
        prog = validate.loads(text, "<fuzz>")
    except SpecError as e:
        try:
            msg = e.render()
        except Exception as e2:
            return None, f"SpecError.render() raised {type(e2).__name__}: {e2}"
        if not isinstance(msg, str) or not msg.strip():
            return None, "SpecError with an empty message"
        return None, None
    except RecursionError:
        return None, "RecursionError escaped the front end"
    except Exception as e:
        return None, f"{type(e).__name__} escaped the front end (expected SpecError):\n{fmt_exc(e)}"
    return prog, None


def check_round_trip(prog: Any) -> str | None:
    """loads(print_program(p)) == p, or what went wrong."""
    from attngen.lang import frontend

    try:
        text = frontend.print_program(prog)
    except Exception as e:
        return f"print_program raised {type(e).__name__}: {e}"
    back, problem = check_front_end(text)
    if problem:
        return f"the printed program does not load cleanly: {problem}\n--- printed ---\n{text}"
    if back is None:
        return f"the printed program is rejected with a SpecError\n--- printed ---\n{text}"
    if back != prog:
        return f"round trip changed the program\n--- printed ---\n{text}"
    return None


# With the CPU backend (a compile of about a second a spec), `--specs` builds and runs the kernel of
# every CPU_SAMPLE-th generated spec (the first included) against the reference.
CPU_SAMPLE = 8
CPU_NOTE = f"CPU backend: every {CPU_SAMPLE}th generated spec compiled and run against the reference"


def fuzz_specs(*, gpu: bool, max_examples: int, seconds: float | None, seed: int, out_dir: str,
               quiet: bool = False, nvcc: Any = None, cpu: bool = False) -> list[Outcome]:
    """Generated valid specs (load, round trip, verify) and mutated specs (SpecError or success);
    with `nvcc` (an `nvcc_check.NvccChecker`) every accepted spec must also compile (`cpu`: CPU_SAMPLE)."""
    half = None if seconds is None else seconds / 2
    outcomes = [
        _fuzz_generated(gpu=gpu, max_examples=max_examples, seconds=half, seed=seed, out_dir=out_dir,
                        quiet=quiet, nvcc=nvcc, cpu=cpu),
        _fuzz_mutated(gpu=gpu, max_examples=max_examples, seconds=half, seed=seed, out_dir=out_dir,
                      quiet=quiet, nvcc=nvcc),
    ]
    if nvcc is not None:
        outcomes.append(nvcc_outcome(nvcc, out_dir, quiet))
    return outcomes


def _fuzz_generated(*, gpu: bool, max_examples: int, seconds: float | None, seed: int, out_dir: str,
                    quiet: bool, nvcc: Any, cpu: bool) -> Outcome:
    """Generated valid specs: each must load, print and reload equal, and verify on random shapes."""
    from hypothesis import strategies as st

    kernels: dict[Any, Any] = {}
    gen = Outcome("generated specs")
    if not gpu:
        gen.notes.append(CPU_NOTE if cpu else "no GPU: generated specs are loaded, round-tripped and run through the reference only")
    seen = [0]

    def gen_body(example: tuple[str, Any]) -> None:
        text, data = example
        prog, problem = check_front_end(text)
        if problem:
            raise AssertionError(f"front end failure on a generated spec:\n{problem}\n--- spec ---\n{text}")
        if prog is None:
            from attngen.lang.diagnostics import SpecError
            from attngen.plan import validate

            try:
                validate.loads(text, "<generated>")
            except SpecError as e:
                raise AssertionError(f"a generated (valid) spec was rejected:\n{e.render()}\n--- spec ---\n{text}") from None
        rt = check_round_trip(prog)
        if rt:
            raise AssertionError(f"{rt}\n--- original ---\n{text}")
        if nvcc is not None and not prog.variants[0].quantized:  # (no CUDA kernel for quantized specs yet)
            nvcc.submit(text, prog.variants)
        v = prog.variants[0]
        case = data.draw(case_strategy(v, max_len=600 if gpu else 96, max_work=(1 << 20) if gpu else (1 << 14)))
        arrays, seen[0] = case_inputs(v, case), seen[0] + 1
        if (gpu and not v.quantized) or (cpu and (v in kernels or (seen[0] - 1) % CPU_SAMPLE == 0)):
            from attngen import backend

            if v not in kernels:
                kernels[v] = backend.compile(v, device="cpu" if cpu else "cuda")
            out, lse = run_kernel(kernels[v], v, arrays)
            gen.kernel_runs += 1
            bad = [r.summary() for r in compare(v, arrays, out, lse) if not r.ok]
            if bad:
                raise AssertionError(f"at {case.describe()}:\n" + "\n".join(bad) + f"\n--- spec ---\n{text}")
        else:
            probs = reference_invariants(v, arrays)
            if probs:
                raise AssertionError(f"at {case.describe()}: " + "; ".join(probs) + f"\n--- spec ---\n{text}")
            if v.quantized:
                from attngen.cpu.render import render as render_cpu

                render_cpu(v)
            else:
                from attngen.cuda.render_decode import render_family

                render_family(v)

    progress = Progress(max_examples, "generated specs", quiet)
    try:
        n, exc, ex = drive(gen_body, st.tuples(spec_strategy(), st.data()), max_examples=max_examples,
                            seconds=seconds, seed=seed, progress=progress, first_failure_dir=out_dir)
    finally:
        progress.close()
    gen.examples = n
    if exc is not None:
        gen.failure = fmt_exc(exc)
        gen.reproducer = _reproducer(out_dir, "spec", ex[0] if isinstance(ex, tuple) else "", gen.failure)
    return gen


def _fuzz_mutated(*, gpu: bool, max_examples: int, seconds: float | None, seed: int, out_dir: str,
                  quiet: bool, nvcc: Any) -> Outcome:
    """Mutated specs (of generated ones and the examples): only success or SpecError; successes
    must also round-trip."""
    from hypothesis import strategies as st

    mut = Outcome("mutated specs")
    seeds_text: list[str] = []
    for p in sorted(Path(__file__).resolve().parent.parent.parent.glob("examples/*.attn")):
        try:
            seeds_text.append(p.read_text(encoding="utf-8"))
        except OSError:
            pass

    @st.composite
    def mutated(draw) -> str:
        base = draw(st.one_of(spec_strategy(), st.sampled_from(seeds_text))) if seeds_text else draw(spec_strategy())
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return mutate(base, rng)

    verdicts = {"loaded": 0, "SpecError": 0}

    def mut_body(text: str) -> None:
        prog, problem = check_front_end(text)
        if problem:
            raise AssertionError(f"{problem}\n--- spec ---\n{text}")
        verdicts["loaded" if prog is not None else "SpecError"] += 1
        if prog is not None:
            rt = check_round_trip(prog)
            if rt:
                raise AssertionError(f"{rt}\n--- original ---\n{text}")
            if nvcc is not None and not prog.variants[0].quantized:
                nvcc.submit(text, prog.variants)

    n_mut = max_examples * 5 if not gpu else max_examples * 2
    progress = Progress(n_mut, "mutated specs", quiet)
    try:
        n, exc, ex = drive(mut_body, mutated(), max_examples=n_mut, seconds=seconds, seed=seed + 7919, progress=progress,
                            first_failure_dir=out_dir)
    finally:
        progress.close()
    mut.examples = n
    mut.notes.append(f"mutated specs: {verdicts['loaded']} loaded, {verdicts['SpecError']} rejected with a SpecError")
    if exc is not None:
        mut.failure = fmt_exc(exc)
        mut.reproducer = _reproducer(out_dir, "mutated", ex if isinstance(ex, str) else "", mut.failure)
    return mut


def _reproducer(out_dir: str, prefix: str, text: str, failure: str) -> Path:
    """A folder named by the spec's hash holding the spec and its failure."""
    d = Path(out_dir) / f"{prefix}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.attn").write_text(text, encoding="utf-8")
    (d / "FAILURE.txt").write_text(failure + "\n", encoding="utf-8")
    return d


def nvcc_outcome(nvcc: Any, out_dir: str, quiet: bool) -> Outcome:
    """Wait for the background compiles of the accepted specs; each failure gets a reproducer."""
    if not quiet and nvcc.pending:
        print(f"attngen fuzz: waiting for {nvcc.pending} nvcc compiles", file=sys.stderr, flush=True)
    nvcc.wait()
    out = Outcome("nvcc compiles", examples=nvcc.specs)
    out.notes.append(nvcc.summary())
    if nvcc.out_dir is None:
        nvcc.out_dir = out_dir
        for f in nvcc.failures:
            nvcc._write(f)
    if nvcc.failures:
        out.reproducer = nvcc.reproducer_dir(nvcc.failures[0])
        first = nvcc.failures[0]
        out.failure = (f"{len(nvcc.failures)} accepted spec(s) do not compile; first: variant {first.variant} "
                       f"on {first.arch.value}:\n{first.message}\n--- spec ---\n{first.spec_text}")
    return out
