"""The LM head's backward only where the loss reaches: verl's chunked log-prob kernel, on CPU.

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
is the same up to the order of a float sum; tests/engines/test_head_gradient.py compares it with verl's own
backward. A NaN gradient is non-zero, so it still propagates. GPU runs never take this path (no fused torch
kernel there).
"""

from __future__ import annotations

from typing import Any

_MARK = "_seal_backward_only_where_the_loss_reaches"


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


def verls_backward() -> Any:
    """verl's own `_fused_linear_for_ppo_bwd`, whether or not this process has wrapped it (the wrapper keeps it as
    `__wrapped__`). Checked to be verl's: defined in verl's module under verl's name."""
    from verl.utils.experimental import torch_functional as fused

    fn = fused._fused_linear_for_ppo_bwd
    while getattr(fn, _MARK, False):
        fn = fn.__wrapped__
    if fn.__module__ != fused.__name__ or fn.__qualname__ != "_fused_linear_for_ppo_bwd":
        raise RuntimeError(f"verl's _fused_linear_for_ppo_bwd is replaced by {fn.__module__}.{fn.__qualname__}")
    return fn
