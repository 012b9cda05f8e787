"""seal/engines/verl/head_rows.py: verl's chunked LM-head backward, computed only where the loss reaches,
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

    from seal.engines.verl.head_rows import backward_only_where_the_loss_reaches

    monkeypatch.setattr(fused, "_fused_linear_for_ppo_bwd", fused._fused_linear_for_ppo_bwd)  # restored after
    if request.param:
        backward_only_where_the_loss_reaches()
    return request.param


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_the_gradient_is_verls_and_prompt_rows_are_skipped(monkeypatch, patched_before, entropy_coeff):
    from verl.utils.experimental import torch_functional as fused

    from seal.engines.verl.head_rows import backward_only_where_the_loss_reaches, verls_backward

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

    from seal.engines.verl.head_rows import backward_only_where_the_loss_reaches

    backward_only_where_the_loss_reaches()
    hidden, weights = torch.randn(4, 8), torch.randn(10, 8)
    dlog = torch.tensor([0.0, float("nan"), 0.0, 0.0])
    dh, dw = fused._fused_linear_for_ppo_bwd(dlog, None, hidden, weights, torch.tensor([1, 2, 3, 4]))
    assert torch.isnan(dh[1]).all() and torch.isnan(dw).any() and dh[0].abs().sum() == 0


# --------------------------------------------------------------------------- the forward: the response rows alone
def _nested(lengths: list[int]) -> torch.Tensor:
    return torch.nested.as_nested_tensor([torch.zeros(n, dtype=torch.long) for n in lengths], layout=torch.jagged)


@pytest.mark.parametrize("pad", [0, 3])
def test_the_marked_rows_are_those_verl_keeps(pad):
    """The rows marked for a packed batch are exactly the positions verl's `no_padding_2_padding` reads a
    response's log-probs from (verl's own function on the same batch is the oracle); padding is never marked."""
    from tensordict import TensorDict
    from verl.workers.utils.padding import no_padding_2_padding

    from seal.engines.verl.head_rows import response_rows

    prompts, responses = [5, 9, 3], [4, 1, 7]
    total = sum(prompts) + sum(responses)
    data = TensorDict({"prompts": _nested(prompts), "responses": _nested(responses)}, batch_size=3)
    positions = no_padding_2_padding(torch.arange(total), data)  # [batch, max response] (0-padded)
    kept = {int(p) for row, r in zip(positions, responses, strict=True) for p in row[:r]}
    rows = response_rows(torch.tensor(prompts), torch.tensor(responses), total + pad)
    assert set(rows.nonzero().squeeze(-1).tolist()) == kept and rows.sum() == sum(responses)


@pytest.fixture
def verls_forward(monkeypatch):
    """verl's own `FusedLinearForPPO.forward` and `prepare_model_inputs`, restored after the test (an earlier
    test in this process may have installed the CPU patches)."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from seal.engines.verl.head_rows import unwrapped

    original = unwrapped(FusedLinearForPPO.forward)
    monkeypatch.setattr(FusedLinearForPPO, "forward", original)
    monkeypatch.setattr(FSDPEngineWithLMHead, "prepare_model_inputs",
                        unwrapped(FSDPEngineWithLMHead.prepare_model_inputs))
    assert original.__module__ == "verl.utils.experimental.torch_functional"
    return original


def test_the_forward_computes_the_marked_rows_alone_with_verls_values_and_gradients(monkeypatch, verls_forward):
    from verl.utils.experimental import torch_functional as fused

    from seal.engines.verl.head_rows import forward_only_on_the_response_rows, response_rows

    torch.manual_seed(0)
    prompts, responses = torch.tensor([30, 20]), torch.tensor([10, 12])
    tokens, dim, vocab = int((prompts + responses).sum()) + 2, 8, 50  # 2 rows of padding at the end
    hidden, weights = torch.randn(1, tokens, dim), torch.randn(vocab, dim)
    labels = torch.randint(0, vocab, (1, tokens))
    rows = response_rows(prompts, responses, tokens)

    def run():
        h, w = hidden.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        marked = labels.clone()
        marked._seal_response_rows = rows.view(1, -1)  # as the engine's prepare_model_inputs marks them
        log_probs, entropy = fused.FusedLinearForPPO(chunk_size=16).forward(h, w, marked)
        (-(log_probs[0][rows]).sum() - 0.01 * entropy[0][rows].sum()).backward()
        return log_probs.detach(), entropy.detach(), h.grad, w.grad

    computed = []
    chunk = fused._fused_linear_for_ppo_fwd

    def counting(hidden_states, *args, **kwargs):
        computed.append(hidden_states.shape[0])
        return chunk(hidden_states, *args, **kwargs)

    monkeypatch.setattr(fused, "_fused_linear_for_ppo_fwd", counting)
    want = run()  # verl's forward: the mark means nothing to it
    assert sum(computed) == tokens
    computed.clear()
    forward_only_on_the_response_rows()
    forward_only_on_the_response_rows()  # idempotent: wrapped once
    got = run()
    assert sum(computed) == int(responses.sum()) == int(rows.sum())  # the response rows alone
    for g, w in zip(got[:2], want[:2], strict=True):
        torch.testing.assert_close(g[0][rows], w[0][rows], rtol=1e-6, atol=1e-6)
        assert g.shape == w.shape and g[0][~rows].abs().sum() == 0 and w[0][~rows].abs().sum() > 0
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)  # d hidden: zero off the response
    torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-6)  # d LM head
    # An unmarked labels tensor: every row, as verl computes them.
    computed.clear()
    fused.FusedLinearForPPO(chunk_size=16).forward(hidden, weights, labels)
    assert sum(computed) == tokens
