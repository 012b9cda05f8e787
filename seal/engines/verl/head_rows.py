"""The LM head only where the loss reaches: verl's chunked log-prob kernel, on CPU, forward and backward.

On CPU the verl engine computes log-probs with verl's torch "fused" kernel (`use_fused_kernels`, backend
"torch", set in `seal.engines.verl.config`): it never holds the [tokens, vocab] logits at once, but its backward
recomputes the logits of every 512-token chunk and multiplies them back through the LM head, also for the rows
whose gradient is exactly zero. In a BFCL episode those are most rows: the ~3.3k-token prompt, the observation
tokens and the padding carry no loss (verl keeps the response's log-probs and masks the rest), so ~90% of the
backward's work multiplies zeros (measured on exp/tiny_verl_learn.yaml: the update took 3.5 times the log-prob
pass over the same sequences).

`backward_only_where_the_loss_reaches` wraps verl's per-chunk backward: rows whose upstream gradients (of the
log-prob and of the entropy) are all zero are left out of the chunk's computation. Each row's gradient is
independent of the others' (dlogits row-wise, dhidden = dlogits @ W row-wise, dW a sum over rows), so the result
is the same up to the order of a float sum; tests/engines/test_head_rows.py compares it with verl's own
backward. A NaN gradient is non-zero, so it still propagates. GPU runs never take this path (no fused torch
kernel there).

`forward_only_on_the_response_rows` does the same for the forward, where no gradient says which rows count:
verl keeps a sequence's log-probs and entropies only on its response, the positions
[end - response length - 1, end - 1) of its packed row (`verl.workers.utils.padding.no_padding_2_padding`,
through which every pass reads them: old log-probs, reference, update). The engine's `prepare_model_inputs`
knows the prompts' and responses' lengths; the wrapper marks the labels tensor it hands to the model
(`shift_labels`) with those rows, and the kernel, handed exactly that tensor, computes them alone and leaves 0
in the others (read by nobody). An unmarked call (no response lengths, sequence parallelism, another labels
tensor) computes every row, as verl does. Measured on exp/tiny_verl_learn.yaml's 152k-token vocabulary: the
kernel took 8 s of each ~3.6k-token sequence's forward on one thread, and ~300 rows of it are the response.
tests/engines/test_head_rows.py compares both with verl's own kernel; tests/engines/test_verl_cpu_engine.py
checks verl's engine marks them and returns the same response log-probs.
"""

from __future__ import annotations

from typing import Any

_MARK = "_seal_head_rows_wrapper"  # set on each wrapper below; its `__wrapped__` is verl's function
_ROWS = "_seal_response_rows"  # the attribute of a labels tensor: a bool tensor of its shape, True where kept


def backward_only_where_the_loss_reaches() -> None:
    """Replace `verl.utils.experimental.torch_functional._fused_linear_for_ppo_bwd` (looked up at call time by
    `FusedLinearForPPOFunction.backward`) with a wrapper that computes only the rows with a non-zero upstream
    gradient. Idempotent."""
    import torch
    from verl.utils.experimental import torch_functional as fused

    original = fused._fused_linear_for_ppo_bwd
    if getattr(original, _MARK, False):
        return

    def backward_chunk(dlog_probs: Any, dentropy: Any, hidden_states: Any, vocab_weights: Any, input_ids: Any,
                       temperature: float = 1.0) -> tuple[Any, Any]:
        """Shapes as verl's: dlog_probs, dentropy [T] (or None), hidden_states [T, D], vocab_weights [V, D],
        input_ids [T] -> dhidden [T, D], dvocab [V, D] (a zero scalar when no row has a gradient: the caller
        adds it in place)."""
        upstream = [g for g in (dlog_probs, dentropy) if g is not None]
        live = torch.stack([g != 0 for g in upstream]).any(dim=0)
        if bool(live.all()):
            return original(dlog_probs, dentropy, hidden_states, vocab_weights, input_ids, temperature)
        dhidden = torch.zeros_like(hidden_states)
        if not bool(live.any()):
            return dhidden, vocab_weights.new_zeros(())
        rows = live.nonzero().squeeze(-1)
        part, dvocab = original(None if dlog_probs is None else dlog_probs[rows],
                                None if dentropy is None else dentropy[rows],
                                hidden_states[rows], vocab_weights, input_ids[rows], temperature)
        dhidden[rows] = part.to(dhidden.dtype)
        return dhidden, dvocab

    setattr(backward_chunk, _MARK, True)
    backward_chunk.__wrapped__ = original  # verl's own function, for `verls_backward` (the tests' reference)
    fused._fused_linear_for_ppo_bwd = backward_chunk


def unwrapped(fn: Any) -> Any:
    """verl's own function behind `fn`: `fn` itself unless it is one of this module's wrappers."""
    while getattr(fn, _MARK, False):
        fn = fn.__wrapped__
    return fn


def verls_backward() -> Any:
    """verl's own `_fused_linear_for_ppo_bwd`, whether or not this process has wrapped it (the wrapper keeps it as
    `__wrapped__`). Checked to be verl's: defined in verl's module under verl's name."""
    from verl.utils.experimental import torch_functional as fused

    fn = unwrapped(fused._fused_linear_for_ppo_bwd)
    if fn.__module__ != fused.__name__ or fn.__qualname__ != "_fused_linear_for_ppo_bwd":
        raise RuntimeError(f"verl's _fused_linear_for_ppo_bwd is replaced by {fn.__module__}.{fn.__qualname__}")
    return fn


def response_rows(prompt_lengths: Any, response_lengths: Any, total: int) -> Any:
    """[total] bool: True at the packed positions whose log-prob verl keeps, [end - r - 1, end - 1) for each
    sequence of prompt length p and response length r (end: the running sum of p + r); positions past the
    sequences (padding to `total`) are False."""
    import torch

    rows = torch.zeros(total, dtype=torch.bool)
    end = 0
    for p, r in zip(prompt_lengths.tolist(), response_lengths.tolist(), strict=True):
        end += p + r
        rows[end - r - 1:end - 1] = True
    return rows


def forward_only_on_the_response_rows() -> None:
    """Wrap verl's `FSDPEngineWithLMHead.prepare_model_inputs` (to mark the labels with the response rows) and
    `FusedLinearForPPO.forward` (to compute the marked rows alone). Idempotent."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    prepare, forward = FSDPEngineWithLMHead.prepare_model_inputs, FusedLinearForPPO.forward
    if getattr(prepare, _MARK, False):
        return

    def prepare_model_inputs(self: Any, micro_batch: Any) -> Any:
        model_inputs, output_args = prepare(self, micro_batch)
        labels = model_inputs.get("shift_labels")
        keys = micro_batch.keys()
        if (labels is not None and not self.use_ulysses_sp and "prompts" in keys and "responses" in keys
                and micro_batch["prompts"].is_nested and micro_batch["responses"].is_nested):
            prompts, responses = micro_batch["prompts"].offsets().diff(), micro_batch["responses"].offsets().diff()
            if int((prompts + responses).sum()) + int(output_args.get("pad_size", 0)) == labels.shape[-1]:
                rows = response_rows(prompts, responses, labels.shape[-1]).to(labels.device)
                setattr(labels, _ROWS, rows.view(labels.shape))
        return model_inputs, output_args

    def forward_marked(self: Any, hidden_states: Any, vocab_weights: Any, input_ids: Any,
                       temperature: float = 1.0) -> tuple[Any, Any]:
        """Shapes as verl's: hidden_states [..., T, D], input_ids [..., T] -> log_probs, entropy [..., T]."""
        rows = getattr(input_ids, _ROWS, None)
        if rows is None or self.impl_backend != "torch" or rows.shape != input_ids.shape:
            return forward(self, hidden_states, vocab_weights, input_ids, temperature)
        keep = rows.reshape(-1).nonzero().squeeze(-1)
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        log_probs, entropy = forward(self, flat.index_select(0, keep), vocab_weights,
                                     input_ids.reshape(-1).index_select(0, keep), temperature)
        total = input_ids.numel()
        # index_copy carries the gradient back to the kept rows; the others get none, as under verl's kernel
        # where nothing reads them.
        log_probs = log_probs.new_zeros(total).index_copy(0, keep, log_probs).view(input_ids.shape)
        entropy = entropy.new_zeros(total).index_copy(0, keep, entropy).view(input_ids.shape)
        return log_probs, entropy

    for fn, original in ((prepare_model_inputs, prepare), (forward_marked, forward)):
        setattr(fn, _MARK, True)
        fn.__wrapped__ = original
    FSDPEngineWithLMHead.prepare_model_inputs = prepare_model_inputs
    FusedLinearForPPO.forward = forward_marked
