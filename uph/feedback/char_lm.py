"""A character-level MLP language model with a hand-written, layer-wise backward pass.

Data: a text's characters (vocabulary: the sorted distinct characters, V of them); the last
`test_fraction` of the text is held out. An example is a window of T characters x_1..x_T and
the next character y.

Network, with L hidden layers of widths d_1..d_L and h_l = tanh(a_l):

    a_1 = sum_t E[t, x_t] + b_1          (E: T x V x d_1, a linear map of the one-hot window)
    a_l = h_{l-1} W_l^T + b_l            (l = 2..L)
    z   = h_L W_out^T + b_out            (logits, V)

Loss: the batch mean of CE(z_n, y_n). Per example the output error is e_L = softmax(z) - onehot(y),
the gradient of that example's loss in z.

Backward: delta_l stands for the gradient of one example's loss in the hidden layer's output
h_l (post-activation). Backprop's deltas are g_L = e_L W_out, g_{l-1} = (g_l * tanh'(a_l)) W_l;
other learning rules replace them (uph.feedback.training). From any deltas the parameter
gradients are the batch means of the local outer products with da_l = delta_l * (1 - h_l^2):
dW_l = mean_n da_l h_{l-1}^T, db_l = mean_n da_l, and the output layer always uses its own
local gradient dW_out = mean_n e_L h_L^T, db_out = mean_n e_L.

E is read and its gradient written as its T * V rows, row t * V + x_t for character x_t at position t
(`rows`): one index_select and one index_add_ over them, where indexing E by (t, x_t) pairs took about three
times as long and index_put_ 1.5 to 2 times (`benchmarks/bench_feedback.py --profile`). The values are the same bit
for bit: the same rows summed in the same order, the same gradients accumulated in the same order
(tests/test_feedback.py holds them to the pair-indexed forms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from uph.errors import ConfigError


@dataclass(frozen=True)
class CharCorpus:
    """A text as character ids: the train head and the held-out tail."""

    vocab: str
    train: torch.Tensor
    test: torch.Tensor


def char_corpus(text: str, test_fraction: float, context: int) -> CharCorpus:
    """Encode `text` by its sorted character vocabulary; hold out the last `test_fraction`."""
    vocab = "".join(sorted(set(text)))
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    vocab_points = np.frombuffer(vocab.encode("utf-32-le"), dtype=np.uint32)  # sorted: str order is code point order
    ids = torch.from_numpy(np.searchsorted(vocab_points, code_points).astype(np.int64))
    split = int(len(ids) * (1 - test_fraction))
    for part, tokens in (("train", ids[:split]), ("held-out", ids[split:])):
        if len(tokens) <= context:
            raise ConfigError(
                f"config key 'feedback.test_fraction': the {part} text has {len(tokens)} "
                f"characters, not more than feedback.context={context}"
            )
    return CharCorpus(vocab, ids[:split], ids[split:])


def windows(tokens: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows x (N, T) = tokens[s : s+T] and next characters y (N,) = tokens[s+T]."""
    x = tokens[starts[:, None] + torch.arange(context)]
    return x, tokens[starts + context]


def sample_batch(
    tokens: torch.Tensor, context: int, batch_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(len(tokens) - context, (batch_size,), generator=generator)
    return windows(tokens, starts, context)


def evenly_spaced_windows(tokens: torch.Tensor, context: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` windows spread evenly over `tokens` (fewer if there are fewer positions)."""
    starts = torch.linspace(0, len(tokens) - context - 1, min(count, len(tokens) - context)).long()
    return windows(tokens, starts, context)


def output_error(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """e_L = softmax(z) - onehot(y), per example."""
    e = torch.softmax(z, dim=-1)
    e[torch.arange(len(y), device=y.device), y] -= 1
    return e


def rows(x: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The rows t * V + x[n, t] of E viewed as (T * V, d_1) that a window batch x (N, T) reads, flattened (N * T,)."""
    return (x + vocab_size * torch.arange(x.shape[1], device=x.device)).reshape(-1)


class CharMLP:
    """The module docstring's network; `params` = [E, b_1, W_2, b_2, ..., W_L, b_L, W_out, b_out]."""

    def __init__(self, vocab_size: int, context: int, hidden: list[int], generator: torch.Generator):
        """Weights Gaussian with variance 1 / fan-in (the window's T one-hots count as fan-in T), biases 0."""

        def gaussian(*shape, fan_in):
            return torch.randn(*shape, generator=generator) / fan_in**0.5

        self.params = [gaussian(context, vocab_size, hidden[0], fan_in=context), torch.zeros(hidden[0])]
        for d_in, d_out in zip(hidden, hidden[1:]):
            self.params += [gaussian(d_out, d_in, fan_in=d_in), torch.zeros(d_out)]
        self.params += [gaussian(vocab_size, hidden[-1], fan_in=hidden[-1]), torch.zeros(vocab_size)]

    def to(self, device: torch.device) -> CharMLP:
        self.params = [p.to(device) for p in self.params]
        return self

    @property
    def hidden_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight, bias) of each hidden layer; the first weight is E."""
        return list(zip(self.params[:-2:2], self.params[1:-2:2]))

    def forward(
        self, x: torch.Tensor, noise: list[torch.Tensor] | None = None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """x (N, T) -> the hidden outputs [h_1..h_L] and the logits z (N, V). With `noise` (one (N, d_l)
        tensor per hidden layer) each hidden output is h_l = tanh(a_l) + noise_l, and the layers above
        read the perturbed h_l: the noisy pass of node perturbation (uph.feedback.node_perturbation)."""
        (E, b_1), *rest = self.hidden_weights
        noise = noise or [0.0] * len(self.hidden_weights)
        context, vocab_size, d_1 = E.shape
        embedded = E.view(context * vocab_size, d_1).index_select(0, rows(x, vocab_size))
        h = torch.tanh(embedded.view(*x.shape, d_1).sum(1) + b_1) + noise[0]
        hs = [h]
        for (W, b), noise_l in zip(rest, noise[1:]):
            h = torch.tanh(h @ W.T + b) + noise_l
            hs.append(h)
        W_out, b_out = self.params[-2:]
        return hs, h @ W_out.T + b_out

    def backprop_deltas(self, hs: list[torch.Tensor], e: torch.Tensor) -> list[torch.Tensor]:
        """The true per-example gradients g_l at each hidden output h_l, from the output error e."""
        g = e @ self.params[-2]
        deltas = [g]
        for (W, _), h in zip(reversed(self.hidden_weights[1:]), reversed(hs[1:])):
            g = (g * (1 - h * h)) @ W
            deltas.append(g)
        return deltas[::-1]

    def gradients(
        self, x: torch.Tensor, hs: list[torch.Tensor], e: torch.Tensor, deltas: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Parameter gradients (ordered as `params`) of the batch-mean loss, given each hidden layer's delta."""
        n, context = x.shape
        da = [delta * (1 - h * h) for delta, h in zip(deltas, hs)]
        dE = torch.zeros_like(self.params[0])
        _, vocab_size, d_1 = dE.shape
        per_row = (da[0] / n)[:, None, :].expand(n, context, d_1).reshape(n * context, d_1)
        dE.view(context * vocab_size, d_1).index_add_(0, rows(x, vocab_size), per_row)
        grads = [dE, da[0].mean(0)]
        for da_l, h_below in zip(da[1:], hs):
            grads += [da_l.T @ h_below / n, da_l.mean(0)]
        return grads + [e.T @ hs[-1] / n, e.mean(0)]
