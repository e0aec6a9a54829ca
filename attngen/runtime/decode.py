"""The decode family called from Python (stage: load + launch).

`compile_decode(v)` renders, compiles (cached) and loads a variant's split-KV and combine kernels;
the returned `DecodeKernel` binds each call signature once (`bind_decode`, on the binder's pieces):
it checks the arrays like the forward `Kernel`, picks the split kernel's CTAs and the partial slots
(`SplitSchedule.schedule`, the plan's `split` rules), packs the kernels' ABI fields by name; a later call patches pointers,
takes the fp32 workspace from the binder's pool (none when one slot a row) and launches the plan's
kernels through the driver. `Dispatch` is what
`attngen.compile` returns for variants both families can run: each call goes to the family
`plan_decode.choose_family` picks for its Lq (decode for small Lq), compiling each family on
first use.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from attngen.ir import abi
from attngen.cuda.compile import compile_source
from attngen.ir.nodes import BLOCK_TABLE, CACHE_LENS, DType, Layout, Variant
from attngen.plan.decode import MAX_UNITS_TIMES_CTAS, Family, SplitSchedule, choose_family
from attngen.cuda.render_decode import render_decode
from attngen.plan.op_plan import OpPlan
from attngen.runtime import binder
from attngen.runtime.inputs import positional_inputs_message
from attngen.runtime.binder import (call_outputs,
    MAX_BINDINGS,
    POOL,
    SIG_FNS,
    ArgBuffer,
    Launch,
    bind_sizes,
    byte_range,
    call_signature,
    capturing,
    check_lse,
    check_out,
    contiguous_view,
    cu_function,
    input_fields,
    launch_stream,
    pack_fields,
    seq_strides,
    sig_fn,
    stream_ptr,
    stride_fields,
    torch_current_stream,
    torch_sig,
    allocator,
    NaNCheckError,
    check_dtype,
    external_stream,
    load_functions,
    sm_count,
    view,
)
from attngen.plan.schedule import Arch


@dataclass
class DecodeKernel:
    """A variant's decode family, compiled for one architecture; call it like `Kernel`."""

    variant: Variant
    source: str
    plan: OpPlan  # the decode family's
    compile_seconds: float
    compiler: str
    cached: bool
    _module: Any = None
    _functions: tuple[Any, ...] = ()
    # Row-block counters for merging in the split kernel, one zeroed buffer a (device, stream):
    # every launch leaves them zero, so a stream's launches (and graph replays) share one buffer;
    # launches on different streams, which may overlap, never do. Outgrown buffers are kept (a
    # captured graph may still point at one).
    _counters: dict[tuple[int, int], Any] = field(default_factory=dict)
    _retired: list[Any] = field(default_factory=list)
    device: int = 0
    # Device int64 words, allocated at load: [nan flag (an int), the lowest page id a checked block
    # table held, the least (num_pages - 1 - page id)]; a negative page word is a bad table.
    _status: Any = None
    _bindings: OrderedDict = field(default_factory=OrderedDict)
    _status_views: dict[Any, Any] = field(default_factory=dict)  # library -> its view of _status

    family = Family.DECODE
    # Whether calls merge in the split kernel by default (False: the combine kernel merges). On:
    # the H200 measured it 0.6-9% faster wherever a row block splits (benchmarks/README.md).
    fused_default = True

    @functools.cached_property
    def _input_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.variant.runtime_inputs())

    @functools.cached_property
    def fields(self) -> tuple[Any, ...]:
        """Both decode kernels' ABI fields, in order."""
        return self.plan.fields

    def __call__(self, q: Any, k: Any, v: Any, *positional: Any, out: Any = None, lse: Any = None, stream: Any = None,
                 splits: int | None = None, ctas: int | None = None, fused: bool | None = None, check_pages: bool = True,
                 **inputs: Any) -> Any:
        """Runs split-KV attention then the combine; returns `o`, or `(o, lse)` with `output lse`.
        `splits` overrides the launch-time schedule with that many equal splits of every row
        block, `ctas` with that many equal shares of the call's units (tests and benchmarks use
        them to cover other schedules). `fused=True` merges split partials in the split kernel's
        last CTA a row block instead of a combine launch (`fused_default`; benchmarks compare).

        A paged cache's block table and lengths are checked on the device (page ids in
        [0, num_pages), cache_lens in [Lq, max_pages * page_size]) into status words; `check_pages=True` (default) reads it back at the end of the call (a sync,
        none under CUDA-graph capture, where `raise_pending()` reads it) and raises ValueError
        after this call's kernels were queued (`out` then holds no valid result).
        `check_pages=False` skips the check and the sync (the kernel still reads an out-of-range
        page as zeros, never outside the cache, and clamps cache_lens to the capacity; a length
        below Lq is then the caller's contract). Each call signature (shapes, strides, dtypes,
        devices, stream and these options) is validated and packed once; later calls patch
        pointers and launch through the driver. Runtime inputs go by name, as on every kernel."""
        if positional:
            raise TypeError(positional_inputs_message(f"kernel {self.variant.name}", self._input_names, len(positional)))
        return self._run(q, k, v, out, lse, stream, (splits, ctas, fused, bool(check_pages)), inputs, False)

    def _run(self, q: Any, k: Any, v: Any, out: Any, lse: Any, stream: Any, options: tuple, inputs: dict[str, Any],
             defer: bool) -> Any:
        """`__call__`; with `defer`, the status words are not read back (`raise_pending` does)."""
        order = self._input_names
        arrays = (q, k, v, *[inputs[n] for n in order if n in inputs]) if order else (q, k, v)
        sig = call_signature(arrays)
        if sig is None or len(arrays) != 3 + len(order) or len(inputs) != len(order):
            bind_decode(self, arrays, inputs, out, lse, 0, options)  # raises the precise error
            raise ValueError("q, k, v: expected CuPy arrays or torch CUDA tensors")
        sigs, ptrs = sig
        is_torch = SIG_FNS.get(type(q)) is torch_sig
        sp = launch_stream(stream, is_torch, sigs[0][3])
        out_sig = lse_sig = None
        op = 0
        if out is not None:
            fo = sig_fn(out)
            out_sig, op = fo(out) if fo is not None else (type(out), 0)
        if lse is not None:
            fl = sig_fn(lse)
            lse_sig = fl(lse)[0] if fl is not None else type(lse)
        key = (sigs, out_sig, lse_sig, sp, options)
        b = self._bindings.get(key)
        if b is None:
            b = bind_decode(self, arrays, inputs, out, lse, sp, options)
            if b.cacheable:
                self._bindings[key] = b
                while len(self._bindings) > MAX_BINDINGS:
                    self._bindings.popitem(last=False)
        out, op, lse, lp = call_outputs(b, self.variant.dtype, ptrs, out, op, lse, is_torch)
        ws: Any = ()
        if b.ws_specs:
            ws = [b.alloc((n,), dt) for n, dt in b.ws_specs] if capturing(sp) else POOL.take(b.pool_keys, b.ws_specs, b.alloc)
        with POOL.stream_lock(sp) if ws else b.lock:
            vals = b.args.vals
            for slot, p in zip(b.array_slots, ptrs):
                vals[slot] = p
            vals[b.out_slot] = op
            if b.lse_slot >= 0:
                vals[b.lse_slot] = lp
            for slot, w in zip(b.ws_slots, ws):
                vals[slot] = w.data_ptr() if is_torch else w.data.ptr
            if b.page_check is not None:
                self._pages_checked = b.page_check
                check_page_ids(arrays, b.page_check, self, sp)
            for ln in b.launches:
                binder.launch_driver(ln, sp)
        if b.readback and not defer and not capturing(sp):
            self._read_status(sp, b.page_check)
        return (out, lse) if self.variant.lse else out

    def _status_view(self, like: Any) -> Any:
        """Words 1 to 4 of the status (the page and length words) as an array of `like`'s library."""
        lib = type(like).__module__.split(".")[0]
        got = self._status_views.get(lib)
        if got is None:
            st = self._status
            if lib == "torch":
                import torch

                st = torch.as_tensor(st, device=like.device)
            got = self._status_views[lib] = st[1:STATUS_WORDS]
        return got

    def _read_status(self, sp: int, page_check: PageCheck | None) -> None:
        """Reads the status words back (a sync) and raises the error they hold, resetting them."""
        nan, lo, slack, short, over = binder.read_words(self._status.data.ptr, STATUS_WORDS, sp)
        if (nan & 0xFFFFFFFF) == 0 and min(lo, slack, short, over) >= 0:
            return
        binder.write_words(self._status.data.ptr, STATUS_INIT, sp)
        num_pages = page_check.num_pages if page_check else 0
        if (short < 0 or over < 0) and page_check is not None:
            Lq, Lk = page_check.Lq, page_check.Lk
            try:
                abi.check_cache_lens(Lq + short, Lk - over, Lq, Lk)
            except ValueError as e:
                raise ValueError(f"{e} (variant {self.variant.name}; this call's output is not valid; "
                                 "check_pages=False skips this check)") from None
        if lo < 0 or slack < 0:
            raise ValueError(f"block_table: expected page ids in [0, {num_pages}), got values from {lo} to {num_pages - 1 - slack} "
                             f"(variant {self.variant.name}; this call's output is not valid; check_pages=False skips this check)")
        raise NaNCheckError(f"variant {self.variant.name}: the output holds NaN or Inf (nan_check)")

    def raise_pending(self, stream: Any = None) -> None:
        """Raises an error a call under CUDA-graph capture left in the status words (a bad block
        table, nan_check), synchronising `stream` (default: the current CuPy stream)."""
        if self._status is None:
            return
        sp = stream_ptr(stream) if stream is not None else launch_stream(None, False, self.device)
        self._read_status(sp, getattr(self, "_pages_checked", None))

    def counters(self, sp: int, n: int) -> int:
        """Device address of at least n zeroed int32 row-block counters for stream `sp`, or 0 when
        that would allocate during CUDA-graph capture (the call then merges with the combine
        kernel). A new buffer is zeroed by an async memset on `sp` itself (no host sync): the
        launches queued after it on that stream see zeros, and leave them zero."""
        key = (self.device, sp)
        with _LOCK:
            buf = self._counters.get(key)
            if buf is not None and buf.size >= n:
                return int(buf.data.ptr)
            if capturing(sp):
                return 0
            import cupy

            size = max(n, 1024, 2 * buf.size if buf is not None else 0)
            new = cupy.empty(size, dtype=cupy.int32)
            binder.zero_async(int(new.data.ptr), size, sp)
            if buf is not None:
                self._retired.append(buf)
            self._counters[key] = new
            return int(new.data.ptr)


# ---------------------------------------------------------------------------------------------
# Binding a decode call signature (`attngen.runtime.binder`)

# nan_check's word, then the paged cache's: the least page id, the least (num_pages - 1 - page id),
# the least (cache_lens - Lq) and the least (capacity - cache_lens); a negative one is an error.
STATUS_WORDS = 5
STATUS_INIT = (0, *((1 << 63) - 1,) * (STATUS_WORDS - 1))


@dataclass(frozen=True, slots=True)
class PageCheck:
    """Where a paged call's block table and cache_lens are among the call arrays, and the bounds
    they are checked against."""

    table: int
    lens: int
    num_pages: int
    Lq: int
    Lk: int


@dataclass
class DecodeBinding:
    """What one decode call signature needs, built once: the split (and combine) launches over one
    argument buffer, where each call's pointers go, the workspaces and the output shapes."""

    args: ArgBuffer
    launches: list[Launch]
    array_slots: list[int]  # per call array (q, k, v, runtime inputs)
    out_slot: int
    lse_slot: int
    ws_slots: list[int]
    ws_specs: list[tuple[int, DType]]
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...] | None
    extents: list[tuple[int, int]]
    out_extent: tuple[int, int]
    page_check: PageCheck | None
    readback: bool
    cacheable: bool  # False when built under capture without counters (a later call may have them)
    alloc: Any
    pool_keys: tuple[tuple[Any, ...], ...]
    lock: threading.Lock = field(default_factory=threading.Lock)
    new_out: Any = None  # `binder.maker`s of the output and the LSE
    new_lse: Any = None


def _schedule(dp: SplitSchedule, B: int, Lq: int, Lk: int, splits: int | None, ctas: int | None, device: int) -> tuple[int, int]:
    """(slots a row, CTAs) of a call: the plan's schedule or a caller's override, checked."""
    n_chunks = max(1, -(-Lk // dp.chunk))
    units = dp.units(B, Lq, Lk)
    if splits is not None and ctas is not None:
        raise ValueError("splits, ctas: expected at most one of the two schedule overrides")
    if splits is not None:
        if not 1 <= splits <= n_chunks:
            raise ValueError(f"splits: expected 1 to {n_chunks} (chunks of {dp.chunk} keys), got {splits}")
        n_ctas = dp.split_ctas(B, Lq, Lk, splits)
        n_split = dp.slots(B, Lq, n_ctas)
    elif ctas is not None:
        if not 1 <= ctas <= units:
            raise ValueError(f"ctas: expected 1 to {units} (row blocks x chunks of {dp.chunk} keys), got {ctas}")
        n_ctas, n_split = ctas, dp.slots(B, Lq, ctas)
    else:
        n_split, n_ctas = dp.schedule(B, Lq, Lk, sm_count(device))
    if units * n_ctas >= MAX_UNITS_TIMES_CTAS:
        raise ValueError(f"B, Lq, Lk: {units} work units over {n_ctas} CTAs overflow the kernels' share arithmetic")
    return n_split, n_ctas


def bind_decode(kern: DecodeKernel, arrays: tuple[Any, ...], inputs: dict[str, Any], out: Any, lse: Any, sp: int,
                options: tuple) -> DecodeBinding:
    """The full validation of one decode signature and its argument buffer by field name."""
    splits, ctas, fused, check_pages = options
    var, op = kern.variant, kern.plan
    dp = op.split
    assert dp is not None
    aq, ak, av = view(arrays[0], "q"), view(arrays[1], "k"), view(arrays[2], "v")
    for a, n, want in ((aq, "q", var.q_dtype), (ak, "k", var.k_dtype), (av, "v", var.v_dtype)):
        check_dtype(a, want, n)
    given = {name: view(x, name) for name, x in inputs.items()}
    sizes = bind_sizes(var, aq, ak, av, given)
    dev = kern.device
    for name, a in (("q", aq), ("k", ak), ("v", av), *given.items()):
        if a.device != dev:
            raise ValueError(f"{name}: expected an array on cuda:{dev}, where this kernel was loaded, got cuda:{a.device}")
    B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
    paged = var.page_size is not None
    qs, ks, vs = (seq_strides(var, a, n, paged=p, align=16 // a.itemsize)
                  for a, n, p in ((aq, "q", False), (ak, "k", paged), (av, "v", paged)))
    o_shape = tuple(abi.o_shape(var, B, Lq))
    if out is None:
        ao = contiguous_view(o_shape, var.dtype, dev, aq.is_torch)
    else:
        ao = view(out, "out")
        check_out(ao, aq, ak, av, var.dtype, o_shape)
    os_ = seq_strides(var, ao, "out", align=8)
    if lse is not None:
        if not var.lse:
            raise ValueError("lse: this variant does not compute the LSE (add `output lse` to the spec)")
        check_lse(view(lse, "lse"), aq, (B, var.heads, Lq))
    n_split, n_ctas = _schedule(dp, B, Lq, Lk, splits, ctas, dev)
    merge = kern.fused_default if fused is None else bool(fused)
    count_ptr = kern.counters(sp, dp.row_blocks(B, Lq)) if merge and n_split > 1 else 0
    fixed, in_ptrs = input_fields(var, given)
    fixed.update({"B": B, "Lq": Lq, "Lk": Lk, "q_offset": 0, "kv_offset": 0, "Lq_total": Lq, "Lk_total": Lk,
                  "splits": n_split, "ctas": n_ctas, "num_pages": ak.shape[0], "ws_count": count_ptr, "lse": 0, "ws_o": 0, "ws_lse": 0,
                  "nan_flag": kern._status.data.ptr if var.nan_check else 0})
    for t, st in (("q", qs), ("k", ks), ("v", vs), ("o", os_)):
        fixed.update(stride_fields(t, st))
    ws = ("ws_o", "ws_lse") if n_split > 1 else ()
    call = ("q", "k", "v", *in_ptrs)
    args, _, slots = pack_fields(kern.fields, fixed, (*call, "o", *(("lse",) if var.lse else ()), *ws), op.kernel_name)
    launches = []
    for ln, fn in zip(op.launches(B, Lq, n_split, n_ctas, merged=bool(count_ptr)), kern._functions):
        launches.append(Launch(cu_function(fn), ln.grid, ln.threads, ln.smem_bytes, args))
        launches[-1].bind_stream(sp)
    ws_o_shape, ws_lse_shape = dp.workspace_shapes(B, Lq, n_split)
    ws_specs = [(math.prod(ws_o_shape), DType.FP32), (math.prod(ws_lse_shape), DType.FP32)][:len(ws)]
    page_check = PageCheck(3 + kern._input_names.index(BLOCK_TABLE), 3 + kern._input_names.index(CACHE_LENS), ak.shape[0], Lq, Lk) \
        if paged and check_pages and all(given[BLOCK_TABLE].shape) else None
    alloc = allocator(aq.is_torch, aq.obj.device if aq.is_torch else None, sp)
    lse_shape = tuple(abi.lse_shape(var, B, Lq)) if var.lse else None
    return DecodeBinding(
        args=args, launches=launches, array_slots=[slots[n] for n in call], out_slot=slots["o"], lse_slot=slots.get("lse", -1),
        ws_slots=[slots[n] for n in ws], ws_specs=ws_specs,
        out_shape=o_shape, lse_shape=lse_shape,
        extents=[(byte_range(a)[0] - a.ptr, byte_range(a)[1] - a.ptr) for a in (aq, ak, av)],
        out_extent=(byte_range(ao)[0] - ao.ptr, byte_range(ao)[1] - ao.ptr), page_check=page_check,
        readback=var.nan_check or page_check is not None, cacheable=bool(count_ptr) or not (merge and n_split > 1),
        alloc=alloc, pool_keys=POOL.keys((aq.is_torch, dev, sp), ws_specs),
        new_out=binder.maker(alloc, o_shape, var.dtype), new_lse=binder.maker(alloc, lse_shape, DType.FP32) if lse_shape else None)


def check_page_ids(arrays: Any, pc: PageCheck, kern: DecodeKernel, sp: int) -> None:
    """Folds a block table's lowest page id, its least (num_pages - 1 - page id), and cache_lens'
    least (length - Lq) and least (capacity - length) into the status words, on stream `sp` with no
    host sync (reductions and an elementwise minimum in the table's library); a negative word is
    a page outside the cache or a length outside [Lq, capacity]."""
    table, lens, num_pages = arrays[pc.table], arrays[pc.lens], pc.num_pages
    words = kern._status_view(table)
    if type(table).__module__.startswith("torch"):
        import torch

        ctx = contextlib.nullcontext() if torch_current_stream(table.device.index) == sp else \
            torch.cuda.stream(torch.cuda.ExternalStream(sp, device=table.device))
        with ctx:
            lo, hi = torch.aminmax(table)
            llo, lhi = torch.aminmax(lens)
            found = torch.stack((lo.long(), (num_pages - 1) - hi.long(), llo.long() - pc.Lq, pc.Lk - lhi.long()))
            torch.minimum(words, found, out=words)
        return
    import cupy

    with external_stream(sp):
        found = cupy.stack((table.min(), (num_pages - 1) - table.max(), lens.min() - pc.Lq, pc.Lk - lens.max()))
        cupy.minimum(words, found.astype(cupy.int64), out=words)


_DECODE: dict[tuple[Variant, Arch, int, tuple[int, int] | None], DecodeKernel] = {}
_LOCK = threading.Lock()


def compile_decode(v: Variant, arch: Arch, *, verbose: bool = False, tile: tuple[int, int] | None = None) -> DecodeKernel:
    """Render, compile (cached) and load a variant's decode kernels for the current device
    (`tile` overrides the schedule, for sweeps)."""
    import cupy

    dev = cupy.cuda.Device().id
    key = (v, arch, dev, tile)
    with _LOCK:
        if key in _DECODE:
            return _DECODE[key]
    t0 = time.perf_counter()
    src, op = render_decode(v, arch, tile)
    binary = compile_source(src, arch)
    module, by_name = load_functions(binary.cubin, {k.name: k.smem.bytes for k in op.kernels})
    fns = tuple(by_name[k.name] for k in op.kernels)  # in launch order: split, combine
    k = DecodeKernel(v, src, op, binary.seconds, binary.compiler, binary.cached, module, fns, device=dev)
    # The status words, allocated at load (never during a call, so that a captured call allocates nothing).
    k._status = cupy.array(STATUS_INIT, dtype=cupy.int64)
    cupy.cuda.Device().synchronize()
    if verbose:
        what = "cache hit" if binary.cached else f"compiled in {binary.seconds:.2f} s"
        print(f"attngen: {v.name} (decode) for {arch.value} with {binary.compiler}: {what}; load {time.perf_counter() - t0:.3f} s total")
    with _LOCK:
        return _DECODE.setdefault(key, k)


def _lq_of(var: Variant, q: Any) -> int:
    """Lq of a q argument (its layout's sequence dim), before any checks (those come in the
    kernel the call goes to); None-safe for odd inputs, which the forward then refuses."""
    shape = getattr(q, "shape", ())
    if len(shape) != 4:
        return -1
    return int(shape[2] if var.layout == Layout.BHSD else shape[1])


# `DecodeKernel.__call__`'s options of a call that passes none: (splits, ctas, fused, check_pages)
_PLAIN = (None, None, None, True)


class Dispatch:
    """The forward kernel plus the decode family: calls with small Lq go to decode (see
    `choose_family`), others to the forward kernel. Attributes are the forward kernel's."""

    def __init__(self, forward: Any, arch: Arch, verbose: bool = False) -> None:
        self.forward = forward
        self._arch = arch
        self._verbose = verbose
        self._decode: DecodeKernel | None = None
        self._families: dict[int, Family] = {}

    @property
    def decode(self) -> DecodeKernel:
        """The decode kernels (compiled on first use)."""
        if self._decode is None:
            self._decode = compile_decode(self.forward.variant, self._arch, verbose=self._verbose)
        return self._decode

    def family_for(self, Lq: int) -> Family:
        """The family of a call with Lq query rows (`choose_family`, remembered per Lq: a call does not re-plan)."""
        fam = self._families.get(Lq)
        if fam is None:
            fam = self._families[Lq] = choose_family(self.forward.variant, Lq)
        return fam

    def ready_decode(self, Lq: int) -> DecodeKernel | None:
        """The decode kernels when a call with Lq query rows goes to them and they are compiled
        (an earlier such call compiled them), else None: a decode loop's calls, without re-planning."""
        return self._decode if self._families.get(Lq) is Family.DECODE else None

    def __call__(self, q: Any, k: Any, v: Any, *positional: Any, **kw: Any) -> Any:
        if positional:
            raise TypeError(positional_inputs_message(f"kernel {self.forward.variant.name}", self.forward._input_names,
                                                      len(positional)))
        lq = _lq_of(self.forward.variant, q)
        dec = self.ready_decode(lq)
        if dec is not None and not kw:
            # a decode step with no options (the usual one): straight to the decode kernels' call
            return dec._run(q, k, v, None, None, None, _PLAIN, {}, False)
        # Calls placed in a longer sequence (q_offset, kv_offset, Lq_total, Lk_total) run on the
        # forward family, the one whose ABI carries positions.
        placed = bool(kw) and any(kw.get(n) for n in ("q_offset", "kv_offset", "Lq_total", "Lk_total"))
        if lq >= 1 and not placed and (self._families.get(lq) or self.family_for(lq)) is Family.DECODE:
            if "check_inputs" in kw:  # the forward's name for the promise checks; decode's is the page check
                kw.setdefault("check_pages", kw.pop("check_inputs"))
            return self.decode(q, k, v, **kw)
        return self.forward(q, k, v, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.forward, name)


__all__ = ["DecodeKernel", "Dispatch", "compile_decode"]
