"""seal/engines/verl/head_gradient.py: verl's chunked LM-head backward, computed only where the loss reaches,
gives verl's own gradients (verl's `FusedLinearForPPOFunction`, run with the wrapper and with verl's original
function).

The reference is verl's original whatever ran before in this process: `install_cpu_patches` (called in the test
process by tests/engines/test_vllm_cpu_weight_sync.py's `cpu_patched` fixture) leaves the wrapper installed for the
rest of the process, so the reference is taken from `verls_backward()` (the function the wrapper keeps, checked to
be verl's) and installed for the reference run; `patched_before` runs each test after such a patch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")


def _grads(hidden, weights, ids, mask, entropy_coeff):
    from verl.utils.experimental.torch_functional import FusedLinearForPPOFunction

    h = hidden.clone().requires_grad_(True)
    w = weights.clone().requires_grad_(True)
    log_probs, entropy = FusedLinearForPPOFunction.apply(h, w, ids, 1.0, 16)
    loss = -(log_probs * mask).sum()
    if entropy_coeff:
        loss = loss - entropy_coeff * (entropy * mask).sum()
    loss.backward()
    return log_probs.detach(), h.grad, w.grad


@pytest.fixture(params=[False, True], ids=["fresh_process", "patched_before"])
def patched_before(request, monkeypatch):
    """`patched_before`: the wrapper is already installed, as after install_cpu_patches in an earlier test file."""
    from verl.utils.experimental import torch_functional as fused

    from seal.engines.verl.head_gradient import backward_only_where_the_loss_reaches

    monkeypatch.setattr(fused, "_fused_linear_for_ppo_bwd", fused._fused_linear_for_ppo_bwd)  # restored after
    if request.param:
        backward_only_where_the_loss_reaches()
    return request.param


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_the_gradient_is_verls_and_prompt_rows_are_skipped(monkeypatch, patched_before, entropy_coeff):
    from verl.utils.experimental import torch_functional as fused

    from seal.engines.verl.head_gradient import backward_only_where_the_loss_reaches, verls_backward

    torch.manual_seed(0)
    tokens, dim, vocab = 80, 8, 50
    hidden, weights = torch.randn(tokens, dim), torch.randn(vocab, dim)
    ids = torch.randint(0, vocab, (tokens,))
    # A prompt (rows 0-39: three whole 16-row chunks and part of one), then a response with a masked-out
    # observation (rows 55-59) and padding at the end.
    mask = torch.zeros(tokens)
    mask[40:55] = 1.0
    mask[60:75] = 1.0
    original = verls_backward()
    rows_seen = []
    reference_rows = []

    def reference(dlog_probs, dentropy, hidden_states, vocab_weights, input_ids, temperature=1.0):
        reference_rows.append(hidden_states.shape[0])
        return original(dlog_probs, dentropy, hidden_states, vocab_weights, input_ids, temperature)

    fused._fused_linear_for_ppo_bwd = reference  # verl's own backward, uncounted by the wrapper
    want = _grads(hidden, weights, ids, mask, entropy_coeff)
    # the reference ran verl's backward over every row of all five 16-row chunks: it is not the wrapper
    assert reference_rows == [16] * 5, reference_rows

    def counting(dlog_probs, dentropy, hidden_states, vocab_weights, input_ids, temperature=1.0):
        rows_seen.append(hidden_states.shape[0])
        return original(dlog_probs, dentropy, hidden_states, vocab_weights, input_ids, temperature)

    fused._fused_linear_for_ppo_bwd = counting
    backward_only_where_the_loss_reaches()
    backward_only_where_the_loss_reaches()  # idempotent: wrapped once
    got = _grads(hidden, weights, ids, mask, entropy_coeff)

    assert torch.equal(got[0], want[0])  # the forward is verl's, untouched
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)
    assert got[1][:40].abs().sum() == 0 and got[1][40:55].abs().sum() > 0
    # Only the 30 rows with a gradient went through verl's backward (chunks 0-1 skipped whole).
    assert sum(rows_seen) == 30 and len(rows_seen) == 3, rows_seen


def test_a_nan_gradient_still_propagates(patched_before):
    from verl.utils.experimental import torch_functional as fused

    from seal.engines.verl.head_gradient import backward_only_where_the_loss_reaches

    backward_only_where_the_loss_reaches()
    hidden, weights = torch.randn(4, 8), torch.randn(10, 8)
    dlog = torch.tensor([0.0, float("nan"), 0.0, 0.0])
    dh, dw = fused._fused_linear_for_ppo_bwd(dlog, None, hidden, weights, torch.tensor([1, 2, 3, 4]))
    assert torch.isnan(dh[1]).all() and torch.isnan(dw).any() and dh[0].abs().sum() == 0
