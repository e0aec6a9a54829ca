"""attngen as a transformers attention implementation: small random models against eager attention.

On the CPU the attention runs through the NumPy float64 reference (`use_reference_on_cpu`), so the
tests hold the integration (spec building, masks, layouts, gradients' plumbing) to eager attention
tightly; GPU-marked tests run the same models through the CUDA kernels.
"""

from __future__ import annotations

import copy
import importlib.util
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
if not hasattr(transformers, "AttentionInterface") or importlib.util.find_spec("transformers.masking_utils") is None:
    pytest.skip("transformers is older than 4.53 (no AttentionMaskInterface)", allow_module_level=True)

import attngen.integrations.transformers as hf  # noqa: E402  (registers "attngen")
from attngen.lang.frontend import format_source  # noqa: E402
from attngen.plan.validate import loads  # noqa: E402

VOCAB = 128
SEQ = 12


def _configs() -> dict[str, object]:
    """Small random configs, head_dim 32 (attngen's smallest) and windows shorter than SEQ."""
    out: dict[str, object] = {}
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=VOCAB, head_dim=32)
    out["llama"] = transformers.LlamaConfig(**common)
    if hasattr(transformers, "Gemma2Config"):
        out["gemma2"] = transformers.Gemma2Config(**common, sliding_window=4, attn_logit_softcapping=2.0,
                                                  query_pre_attn_scalar=24, final_logit_softcapping=None)
    if hasattr(transformers, "Qwen3Config"):
        out["qwen3"] = transformers.Qwen3Config(**common)
    if hasattr(transformers, "GptOssConfig"):
        out["gpt_oss"] = transformers.GptOssConfig(**common, sliding_window=4, num_local_experts=4,
                                                   num_experts_per_tok=2)
    return out


CONFIGS = _configs()
FAMILIES = sorted(CONFIGS)


@pytest.fixture(autouse=True)
def _reference_on_cpu():
    hf.use_reference_on_cpu(True)
    yield
    hf.use_reference_on_cpu(False)


def _pair(family: str, dtype=torch.float32, device: str = "cpu", impl: str = "attngen", **config):
    """(the model through `impl`, the same weights through eager attention); `config` overrides
    config attributes."""
    torch.manual_seed(0)
    cfg = copy.deepcopy(CONFIGS[family])
    for name, value in config.items():
        setattr(cfg, name, value)
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype)
    eager = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=dtype)
    with torch.no_grad():  # sinks of a few tenths, so that they matter
        for name, p in ours.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 0.5)
    eager.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == impl and eager.config._attn_implementation == "eager"
    return ours.to(device), eager.to(device)


def _batch(device: str = "cpu"):
    """Three rows: full, right-padded (8 tokens) and left-padded (3 pads)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, SEQ), generator=g)
    mask = torch.ones(3, SEQ, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, :3] = 0
    return ids.to(device), mask.to(device)


def _valid(mask):
    return mask.bool()


def _labels(ids, mask):
    """Labels of the tokens predicted from a real token: in a left-padded row the first real token
    is predicted from a padding position, a row no key is visible to (eager attention gives it an
    average over masked keys, attngen zeros), so it is left out of the loss, as padding is."""
    seen = mask.bool().clone()
    seen[:, 1:] &= mask[:, :-1].bool()
    return ids.masked_fill(~seen, -100)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_eager_on_a_padded_batch(family: str) -> None:
    ours, eager = _pair(family)
    ids, mask = _batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = eager(ids, attention_mask=mask).logits
    keep = _valid(mask)
    err = (a[keep] - b[keep]).abs().max().item()
    assert err < 1e-4, f"{family}: max |logit difference| {err}"
    # The padding is not ignored: the same rows without their masks give other logits.
    with torch.no_grad():
        c = ours(ids).logits
    assert (c[2, 3:] - a[2, 3:]).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_training_step_gradients_match_eager(family: str) -> None:
    ours, eager = _pair(family)
    ours.train()
    eager.train()
    ids, mask = _batch()
    labels = _labels(ids, mask)
    for m in (ours, eager):
        m(ids, attention_mask=mask, labels=labels).loss.backward()
    grads = dict(eager.named_parameters())
    checked = 0
    for name, p in ours.named_parameters():
        q = grads[name]
        if p.grad is None or q.grad is None:
            assert p.grad is None and q.grad is None, name
            continue
        scale = q.grad.abs().max().item() + 1e-6
        assert (p.grad - q.grad).abs().max().item() <= 1e-4 * scale + 1e-6, name
        checked += 1
    assert checked > 10
    if family == "gpt_oss":  # the sinks learn through attngen's sink gradient
        sinks = [p for n, p in ours.named_parameters() if n.endswith("sinks")]
        assert sinks and all(s.grad is not None and s.grad.abs().max() > 0 for s in sinks)


def _specs_of(family: str) -> list[str]:
    """The spec texts one padded forward of `family` builds, in call order (no duplicates)."""
    ours, _ = _pair(family)
    seen: list[str] = []
    real = hf.build_variant

    def spy(p, owner="attention"):
        text = hf.spec_text(p)
        if text not in seen:
            seen.append(text)
        return real(p, owner)

    ids, mask = _batch()
    hf.build_variant = spy
    cached = dict(hf._CALLS)
    hf._CALLS.clear()  # (each call's variant is cached: build them all again)
    try:
        with torch.no_grad():
            ours(ids, attention_mask=mask)
    finally:
        hf.build_variant = real
        hf._CALLS.update(cached)
    return seen


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_builder_output_is_canonical_and_checks_clean(family: str) -> None:
    specs = _specs_of(family)
    assert specs
    for text in specs:
        assert format_source(text) == text
        v = loads(text).get()
        assert (v.heads, v.kv_heads, v.head_dim) == (4, 2, 32)
        assert v.norms == ()  # QK-norm (Qwen3) runs in the model, before attention
        # The batch has both paddings: left padding needs the key-range input.
        assert "padding && kv >= kv_start[b]" in text
    joined = "\n".join(specs)
    if family == "gemma2":
        assert "score softcap(2.0)" in joined and "window(3, 0)" in joined
        assert f"scale {24 ** -0.5!r}" in joined
    if family == "gpt_oss":
        assert "input sinks: fp32[H]" in joined and "sink sinks" in joined and "window(3, 0)" in joined
    if family in ("llama", "qwen3"):
        assert "window" not in joined and "scale" not in joined and "mask causal && padding" in joined


def test_spec_text_of_each_mask_mode() -> None:
    base = dict(dtype=hf.DType.BF16, heads=16, kv_heads=4, head_dim=64, value_head_dim=64, scale=None, causal=True,
                window=None, softcap=None, sinks=False, cross=False)
    plain = hf.spec_text(hf.SpecParams(**base, mask=hf.MaskMode.NONE))
    assert plain == ("attention hf_attention {\n  dtype bf16\n  head_dim 64\n  heads 16 kv 4\n  layout bshd\n"
                     "  mask causal\n}\n")
    padded = hf.spec_text(hf.SpecParams(**base, mask=hf.MaskMode.PADDED))
    assert "mask causal && padding\n" in padded and "input" not in padded
    assert loads(padded).get().runtime_inputs()
    for mode in hf.MaskMode:
        cross = mode != hf.MaskMode.DOCUMENTS  # (documents: self attention only, as mask_plan builds them)
        text = hf.spec_text(hf.SpecParams(**{**base, "cross": cross, "window": (127, 0), "softcap": 30.0, "sinks": True},
                                          mask=mode))
        assert format_source(text) == text and loads(text).get().name == "hf_attention"


def test_mask_plans() -> None:
    B, Lq, Lk = 2, 4, 8
    q = torch.arange(Lq)[:, None]
    kv = torch.arange(Lk)[None, :]
    # Decoding into a static cache: 4 queries at positions 3..6, slots 7.. empty (padded 2-D mask).
    static = ((kv <= q + 3) & (kv < 7))[None, None].expand(B, 1, Lq, Lk)
    plan = hf.mask_plan(static, B, Lq, Lk, True, None)
    assert (plan.mode, plan.keys) == (hf.MaskMode.NONE, 7)
    # The same with row 1 left-padded by 2: a key range.
    rng = static.clone()
    rng[1, :, :, :2] = False
    plan = hf.mask_plan(rng, B, Lq, Lk, True, None)
    assert (plan.mode, plan.keys) == (hf.MaskMode.RANGE, 7)
    assert plan.kv_start.tolist() == [0, 2] and plan.kv_lens.tolist() == [7, 7]
    # Eager's additive form of a right-padded self-attention mask.
    allowed = (kv[:, :Lq] <= q)[None].repeat(B, 1, 1)
    allowed[0, :, 3:] = False
    additive = torch.zeros(B, 1, Lq, Lq).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    plan = hf.mask_plan(additive, B, Lq, Lq, True, None)
    assert (plan.mode, plan.keys, plan.kv_lens.tolist()) == (hf.MaskMode.PADDED, Lq, [3, 4])
    assert hf.mask_plan(None, B, Lq, Lk, True, None) == hf.MaskPlan(hf.MaskMode.NONE, Lk)
    # Two packed documents of 3 tokens each: causal within each.
    docs = torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).tril().bool()[None, None]
    plan = hf.mask_plan(docs, 1, 6, 6, True, None)
    assert plan.mode == hf.MaskMode.DOCUMENTS and plan.doc_ids.tolist() == [[0, 0, 0, 1, 1, 1]]


@pytest.mark.parametrize("what, mask", [
    ("not causal", torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).bool()[None, None]),
    ("bias", torch.randn(1, 1, 6, 6)),
    ("per-head", torch.ones(1, 2, 6, 6, dtype=torch.bool)),
])
def test_masks_it_cannot_express_are_refused_naming_the_attribute(what: str, mask) -> None:
    with pytest.raises(hf.UnsupportedAttention, match="attention_mask"):
        hf.mask_plan(mask, 1, 6, 6, True, None)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_sequences_run_as_documents(family: str) -> None:
    """position_ids that restart pack documents into one row: attention stays inside each."""
    ours, eager = _pair(family)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3], list(range(SEQ))])
    specs = []
    real = hf.build_variant
    hf.build_variant = lambda p, owner="attention": specs.append(hf.spec_text(p)) or real(p, owner)
    cached = dict(hf._CALLS)
    hf._CALLS.clear()
    try:
        with torch.no_grad():
            a = ours(ids, position_ids=position_ids, use_cache=False).logits
            b = eager(ids, position_ids=position_ids, use_cache=False).logits
    finally:
        hf.build_variant = real
        hf._CALLS.update(cached)
    assert (a - b).abs().max().item() < 1e-4
    packed = any("document(doc_ids)" in t and "input doc_ids: i32[B, Lk] sorted" in t for t in specs)
    # Llama's mask reads position_ids, so it packs; gpt-oss's does not (transformers attends across
    # the documents there, and so does attngen: the logits above agree either way).
    assert packed or family != "llama"


def test_a_custom_4d_mask_is_refused_naming_the_attribute() -> None:
    ours, _ = _pair("llama")
    mask = torch.rand(1, 1, 6, 6, generator=torch.Generator().manual_seed(3)) > 0.5
    mask |= torch.eye(6, dtype=torch.bool)
    with pytest.raises(hf.UnsupportedAttention, match=r"LlamaAttention: attention_mask: not the module's pattern \(causal"):
        ours(torch.randint(0, VOCAB, (1, 6)), attention_mask=mask, use_cache=False)


def test_unsupported_head_dim_is_refused_naming_it() -> None:
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=VOCAB)  # head_dim 16
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="attngen")
    with pytest.raises(hf.UnsupportedAttention, match=r"LlamaAttention: attngen cannot run(.|\n)*head_dim 16"):
        model(torch.randint(0, VOCAB, (1, 4)))


def test_dropout_while_training_is_refused() -> None:
    cfg = copy.deepcopy(CONFIGS["llama"])
    cfg.attention_dropout = 0.1
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="attngen").train()
    with pytest.raises(hf.UnsupportedAttention, match=r"LlamaAttention\.attention_dropout: 0\.1"):
        model(torch.randint(0, VOCAB, (1, 4)))
    with torch.no_grad():
        model.eval()(torch.randint(0, VOCAB, (1, 4)))  # no dropout at inference


def test_bad_attributes_are_refused_before_the_spec() -> None:
    class Attn(torch.nn.Module):
        is_causal = True

    q = torch.zeros(1, 4, 2, 32)
    with pytest.raises(hf.UnsupportedAttention, match=r"Attn\.sliding_window: expected a positive integer, got '4\}'"):
        hf.attention_forward(Attn(), q, q, q, None, sliding_window="4}")
    with pytest.raises(hf.UnsupportedAttention, match=r"Attn\.scaling: expected a positive finite number"):
        hf.attention_forward(Attn(), q, q, q, None, scaling=float("nan"))
    with pytest.raises(hf.UnsupportedAttention, match=r"Attn\.sinks \(s_aux\): expected one logit a query head"):
        hf.attention_forward(Attn(), q, q, q, None, s_aux=torch.zeros(3))


def test_cpu_without_a_backend_or_the_reference_raises() -> None:
    hf.use_reference_on_cpu(False)
    ours, _ = _pair("llama")
    ids = torch.randint(0, VOCAB, (1, 4))
    has_cpu_backend = importlib.util.find_spec("attngen.cpu") is not None
    if not has_cpu_backend:
        with pytest.raises(RuntimeError, match="CPU backend, which is not installed"), torch.no_grad():
            ours(ids)
    if not has_cpu_backend:
        with pytest.raises(RuntimeError, match="use_reference_on_cpu"):
            ours(ids).logits.sum().backward()


@pytest.mark.parametrize("family, cache", [("llama", "dynamic"), ("llama", "static"), ("gemma2", "static")])
def test_generate_with_a_cache_and_left_padding_matches_eager(family: str, cache: str) -> None:
    """Greedy decoding: prefill, then one query against a growing cache (kind cross); a static
    cache's empty slots are cut off the keys; Gemma-2's sliding layers decode past their window."""
    ours, eager = _pair(family)
    ids, mask = _batch()
    ids, mask = ids[1:], mask[1:].clone()
    mask[0] = 1  # generation pads on the left: one full row, one left-padded row
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.inference_mode():  # (inference tensors: no version counter on the masks)
        a = ours.generate(ids, **kw)
        b = eager.generate(ids, **kw)
    assert torch.equal(a, b)


@pytest.mark.skipif(importlib.util.find_spec("attngen.cpu") is None, reason="attngen's CPU backend is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_backend_logits_match_eager(family: str) -> None:
    """Without the reference, CPU tensors run the CPU backend's kernels (forward only)."""
    hf.use_reference_on_cpu(False)
    ours, eager = _pair(family)
    ids, mask = _batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = eager(ids, attention_mask=mask).logits
    keep = _valid(mask)
    assert (a[keep] - b[keep]).abs().max().item() < 1e-4


@pytest.mark.skipif(importlib.util.find_spec("attngen.cpu") is None, reason="attngen's CPU backend is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_backend_training_step_matches_eager(family: str) -> None:
    """Without the reference, a training step on CPU tensors runs the CPU backend's forward and
    backward kernels through the torch op: logits and every parameter's gradient as eager's."""
    hf.use_reference_on_cpu(False)
    ours, eager = _pair(family)
    ours.train()
    eager.train()
    ids, mask = _batch()
    labels = _labels(ids, mask)
    outs = [m(ids, attention_mask=mask, labels=labels) for m in (ours, eager)]
    keep = _valid(mask)
    assert (outs[0].logits[keep] - outs[1].logits[keep]).abs().max().item() < 1e-4
    for o in outs:
        o.loss.backward()
    grads = dict(eager.named_parameters())
    checked = 0
    for name, p in ours.named_parameters():
        ref = grads[name].grad
        if p.grad is None:
            assert ref is None, name
            continue
        assert (p.grad - ref).abs().max().item() <= 1e-4 * (ref.abs().max().item() + 1e-6) + 1e-6, name
        checked += 1
    assert checked > 10


# ------------------------------------------------------------------------------------------------
# GPU: the CUDA kernels through the torch op


def _cuda_pair(family: str, dtype, impl: str = "attngen", **config):
    ours, eager = _pair(family, dtype=dtype, device="cuda", impl=impl, **config)
    return ours, eager


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_fp32_logits_and_gradients_match_eager(family: str) -> None:
    hf.use_reference_on_cpu(False)
    ours, eager = _cuda_pair(family, torch.float32)
    ours.train()
    eager.train()
    ids, mask = _batch("cuda")
    labels = _labels(ids, mask)
    outs = [m(ids, attention_mask=mask, labels=labels) for m in (ours, eager)]
    keep = _valid(mask)
    assert (outs[0].logits[keep] - outs[1].logits[keep]).abs().max().item() < 1e-3
    for o in outs:
        o.loss.backward()
    grads = dict(eager.named_parameters())
    for name, p in ours.named_parameters():
        if p.grad is None:
            assert grads[name].grad is None, name
            continue
        ref = grads[name].grad
        assert (p.grad - ref).abs().max().item() <= 1e-3 * (ref.abs().max().item() + 1e-6) + 1e-6, name


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_bf16_logits_and_gradients_within_the_error_of_sdpa(family: str) -> None:
    """bf16 against fp32 eager, logits and one training step's gradients: attngen's error within
    twice that of bf16 sdpa (bf16 eager where the model has no sdpa path: Gemma-2's softcap,
    gpt-oss's sinks)."""
    hf.use_reference_on_cpu(False)
    ids, mask = _batch("cuda")
    keep = _valid(mask)
    labels = _labels(ids, mask)
    _, exact = _cuda_pair(family, torch.float32)
    exact.train()
    out = exact(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    ref_logits = out.logits[keep].detach()
    ref_grads = {n: p.grad for n, p in exact.named_parameters() if p.grad is not None}
    model_cls = type(exact)
    peer = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    errs: dict[str, tuple[float, float]] = {}
    for impl in ("attngen", peer):
        model, _ = _cuda_pair(family, torch.bfloat16, impl=impl)
        model.load_state_dict({k: v.to(torch.bfloat16) for k, v in exact.state_dict().items()})
        model.train()
        o = model(ids, attention_mask=mask, labels=labels)
        o.loss.backward()
        logit_err = (o.logits[keep].float() - ref_logits).abs().max().item()
        grad_err = max(((p.grad.float() - ref_grads[n]).norm() / (ref_grads[n].norm() + 1e-12)).item()
                       for n, p in model.named_parameters() if n in ref_grads)
        errs[impl] = (logit_err, grad_err)
    assert errs["attngen"][0] <= 2 * errs[peer][0] + 1e-2, errs
    assert errs["attngen"][1] <= 2 * errs[peer][1] + 1e-2, errs


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_gpu_decode_steps_run_the_decode_family_within_the_error_of_sdpa(family: str, monkeypatch) -> None:
    """bf16 at head dim 64, a prompt with left padding, then one token against the cache (Lq 1,
    kind cross): the step runs attngen's split-KV decode family, and its logits are within twice the error of bf16
    sdpa (eager where the model has no sdpa path) against fp32 eager on the whole sequence."""
    from attngen.runtime import decode as runtime_decode

    if family not in CONFIGS:
        pytest.skip(f"transformers has no {family} config")
    hf.use_reference_on_cpu(False)
    lq = []
    real = runtime_decode.DecodeKernel._run
    monkeypatch.setattr(runtime_decode.DecodeKernel, "_run", lambda self, q, *a: lq.append(int(q.shape[1])) or real(self, q, *a))
    ids, mask = _batch("cuda")
    ids, mask = ids[1:], mask[1:].clone()
    mask[0] = 1  # one full row, one left-padded row
    nxt = torch.randint(0, VOCAB, (2, 1), generator=torch.Generator().manual_seed(5)).cuda()
    full_ids, full_mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    _, exact = _cuda_pair(family, torch.float32, head_dim=64)  # (the decode family's smallest head dim)
    with torch.no_grad():
        want = exact(full_ids, attention_mask=full_mask).logits[:, -1].float()
    peer = "sdpa" if getattr(type(exact), "_supports_sdpa", False) else "eager"
    errs = {}
    for impl in ("attngen", peer):
        model, _ = _cuda_pair(family, torch.bfloat16, impl=impl, head_dim=64)
        model.load_state_dict({k: v.to(torch.bfloat16) for k, v in exact.state_dict().items()})
        with torch.no_grad():
            pre = model(ids, attention_mask=mask, use_cache=True)
            n = len(lq)
            step = model(nxt, attention_mask=full_mask, past_key_values=pre.past_key_values, use_cache=True)
            if impl == "attngen":
                assert lq[n:] and all(x == 1 for x in lq[n:]), lq  # every layer's step: the decode family
        errs[impl] = (step.logits[:, -1].float() - want).abs().max().item()
    assert errs["attngen"] <= 2 * errs[peer] + 1e-2, errs


def test_module_names_no_model_string_in_the_spec() -> None:
    """The spec holds only numbers, enums and fixed words: no identifier from the model."""
    for family in FAMILIES[:1]:
        for text in _specs_of(family):
            words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
            assert words <= {"attention", "hf_attention", "dtype", "fp32", "head_dim", "heads", "kv", "layout", "bshd",
                             "mask", "causal", "padding", "input", "kv_start", "i32", "B", "b", "kind", "cross",
                             "window", "scale", "score", "softcap", "sink", "sinks", "H"}, words


def test_the_docs_example_spec_is_what_the_builder_writes() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "transformers.md").read_text(encoding="utf-8")
    shown = re.findall(r"```\n(attention hf_attention \{.*?\n\}\n)```", page, re.S)
    gemma2_9b_local = hf.SpecParams(dtype=hf.DType.BF16, heads=16, kv_heads=8, head_dim=256, value_head_dim=256,
                                    scale=256 ** -0.5, causal=True, window=(4095, 0), softcap=50.0, sinks=False,
                                    mask=hf.MaskMode.NONE, cross=False)
    assert shown == [hf.spec_text(gemma2_9b_local)]


def test_the_mask_function_builds_a_mask_only_where_the_modules_pattern_is_not_enough() -> None:
    from transformers.masking_utils import causal_mask_function

    base = dict(batch_size=2, q_length=4, kv_length=4, q_offset=0, kv_offset=0, mask_function=causal_mask_function,
                attention_mask=None, allow_is_causal_skip=True, device="cpu", dtype=torch.float32)
    assert hf.mask_function(**base) is None  # plain causal: the module's pattern
    assert hf.mask_function(**{**base, "q_length": 1, "q_offset": 3}) is None  # decoding, bottom-right aligned
    padded = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    built = {
        "padding": {"attention_mask": padded},
        "custom mask function": {"use_vmap": True},
        "no skip allowed": {"allow_is_causal_skip": False},
        "static cache (keys past the queries)": {"q_length": 2, "kv_length": 8},
        "local pattern longer than its window": {"local_size": 2},
    }
    for why, change in built.items():
        m = hf.mask_function(**{**base, **change})
        assert isinstance(m, torch.Tensor) and m.dtype == torch.bool and m.dim() == 4, why
