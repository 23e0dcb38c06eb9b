"""The character MLP: data windows, and its hand-written backward against torch.autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from uph.errors import ConfigError
from uph.feedback.char_lm import CharMLP, char_corpus, evenly_spaced_windows, output_error, sample_batch, windows


def small_model(hidden=(7, 6, 5), vocab=11, context=4, seed=0):
    model = CharMLP(vocab, context, list(hidden), torch.Generator().manual_seed(seed))
    model.params = [p.double() for p in model.params]
    for p in model.params[1::2]:  # non-zero biases so that they matter in the parity checks
        p.uniform_(-0.3, 0.3)
    return model


def batch(vocab=11, context=4, n=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(vocab, (n, context), generator=g), torch.randint(vocab, (n,), generator=g)


def test_char_corpus_encodes_with_a_sorted_vocabulary_and_holds_out_the_tail():
    text = "hello wörld, hello yóu 🙂"  # beyond ASCII too: ids come from code points
    corpus = char_corpus(text, test_fraction=0.25, context=3)
    assert corpus.vocab == "".join(sorted(set(text)))
    decoded = "".join(corpus.vocab[i] for i in torch.cat([corpus.train, corpus.test]))
    assert decoded == text
    assert len(corpus.train) == int(len(text) * 0.75)


def test_char_corpus_names_the_key_when_the_held_out_text_is_shorter_than_the_context():
    with pytest.raises(ConfigError, match=r"'feedback.test_fraction'.*held-out text has 2 characters.*context=8"):
        char_corpus("abcdefghijklmnopqrst", test_fraction=0.1, context=8)


def test_windows_pair_each_context_with_the_next_character():
    tokens = torch.arange(20)
    x, y = windows(tokens, torch.tensor([0, 5, 15]), context=4)
    assert x.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8], [15, 16, 17, 18]]
    assert y.tolist() == [4, 9, 19]
    x, y = sample_batch(tokens, 4, 100, torch.Generator().manual_seed(0))
    assert torch.equal(x[:, -1] + 1, y) and int(y.max()) <= 19
    x, y = evenly_spaced_windows(tokens, 4, 1000)
    assert len(y) == 16 and x[0, 0] == 0 and y[-1] == 19


def test_output_error_is_the_gradient_of_each_examples_cross_entropy():
    z = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    (autograd,) = torch.autograd.grad(F.cross_entropy(z, y, reduction="sum"), z)
    torch.testing.assert_close(output_error(z.detach(), y), autograd)


@pytest.mark.parametrize("hidden", [(7,), (7, 6, 5)])
def test_backprop_through_the_network_reproduces_autograds_gradients(hidden):
    model = small_model(hidden)
    x, y = batch()
    hs, z = model.forward(x)
    e = output_error(z, y)
    manual = model.gradients(x, hs, e, model.backprop_deltas(hs, e))

    params = [p.clone().requires_grad_() for p in model.params]
    model.params = params
    _, z = model.forward(x)
    autograd = torch.autograd.grad(F.cross_entropy(z, y), params)
    assert [g.shape for g in manual] == [p.shape for p in params]
    for mine, theirs in zip(manual, autograd):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


def test_backprop_deltas_are_the_per_example_gradients_at_each_hidden_output():
    model = small_model()
    x, y = batch()
    hs, z = model.forward(x)
    deltas = model.backprop_deltas(hs, output_error(z, y))

    params = [p.clone().requires_grad_() for p in model.params]
    model.params = params
    hs, z = model.forward(x)
    autograd = torch.autograd.grad(F.cross_entropy(z, y, reduction="sum"), hs)
    for mine, theirs in zip(deltas, autograd):
        torch.testing.assert_close(mine, theirs)


def test_gradients_from_arbitrary_deltas_are_local_outer_products():
    model = small_model()
    x, y = batch()
    hs, z = model.forward(x)
    e = output_error(z, y)
    g = torch.Generator().manual_seed(5)
    deltas = [torch.randn(h.shape, generator=g, dtype=torch.float64) for h in hs]
    grads = model.gradients(x, hs, e, deltas)
    n = len(y)
    da = [d * (1 - h**2) for d, h in zip(deltas, hs)]
    # E[t, v] collects da_1 of the examples whose t-th character is v
    t, v = 2, int(x[0, 2])
    torch.testing.assert_close(grads[0][t, v], da[0][x[:, t] == v].sum(0) / n)
    torch.testing.assert_close(grads[2], torch.einsum("ni,nj->ij", da[1], hs[0]) / n)
    torch.testing.assert_close(grads[5], da[2].mean(0))
    # the output layer ignores the deltas: its own local gradient
    torch.testing.assert_close(grads[-2], e.T @ hs[-1] / n)
    torch.testing.assert_close(grads[-1], e.mean(0))
