"""A split's tokens with their base distribution p0, computed once (`prepare`: the only V×H products)
and cached within a memory budget; the fit objective (uph.lm.engine.objective) and the evaluation read them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from uph.lm.data.models import OutputLayer
from uph.splits import split_lengths

CHUNK = 256  # tokens per chunk on a CPU: p0 of a chunk is a [V, CHUNK] block, 50 MB at V = 49152
GPU_CHUNK = 1024  # on a GPU (chunk_size)
MIXED_BYTES = 512 * 2**20  # a mixture's p0 kept per mixed Tokens (Tokens.mixed): a fit part of 1,300 tokens at
# V = 49,152 is 256 MB, which every evaluation of a path of radii reads


def chunk_size(device: torch.device | str) -> int:
    """Tokens per chunk on `device`. An evaluation's pass over a chunk is some fifteen operations, a few of
    them over [V, c] blocks. A CPU runs them at one speed whatever c. A GPU runs them as the host queues
    them, and idles unless a chunk's work outlasts the host's time to queue it (a kernel launch costs
    microseconds: docs/performance.md, "Training branches"). At c = 256 and V = 49152 a block is 50 MB,
    which an H200's 4.8 TB/s streams in about 10 us; at c = GPU_CHUNK four times that, and a few blocks of
    200 MB (600 MB at V = 152k) are a chunk's working memory."""
    return CHUNK if torch.device(device).type == "cpu" else GPU_CHUNK


@dataclass(frozen=True)
class CacheFloor:
    """A chunk's neural-cache part of a mixture base (Mixture; uph.lm.engine.neural_cache.cache_floor): rows
    `support` [U] (sorted) of the vocabulary, `values` [U, c] the weighted cache probabilities of each of
    the chunk's c tokens, zero off the support. Only tokens some datastore entry holds get mass, so U is
    far below V: the floor costs U/V of the chunk's p0."""

    support: torch.Tensor
    values: torch.Tensor

    def columns(self, index) -> CacheFloor:
        return CacheFloor(self.support, self.values[:, index])

    def at(self, targets: torch.Tensor) -> torch.Tensor:
        """The floor at each token's target [c] (float64; 0 off the support)."""
        index = torch.searchsorted(self.support, targets).clamp_(max=len(self.support) - 1)
        picked = self.values.gather(0, index[None, :]).squeeze(0).double()
        return picked.masked_fill(self.support[index] != targets, 0)


@dataclass
class Chunk:
    hidden: torch.Tensor  # [c, H] as given (float32 or bfloat16)
    targets: torch.Tensor  # [c] next-token ids
    nll0: torch.Tensor  # [c] base cross-entropy per token
    p0: torch.Tensor | None  # [V, c] the model's probabilities up to a factor per token; None: recomputed
    floor: CacheFloor | None = None  # a neural cache's part of a mixture base, per token (Tokens.mixed)
    scale: torch.Tensor | None = None  # [c] a mixture's weight / Σ_v p0_v, once per token (Tokens.mixed)
    mixed: torch.Tensor | None = None  # [V, c] the mixture's probabilities, kept (Tokens.mixed); None: mixed as read


@dataclass(frozen=True)
class Mixture:
    """A base distribution that mixes the model with caches: p_t(v) = weight p_model(v | h_t) + floor(v)
    + floor_t(v), where `floor` [V] is a unigram cache's share (None: none) and floor_t a neural cache's,
    which differs per token (the chunk's CacheFloor). The floors are >= 0 and sum with `weight` to 1.
    Its log is a base logit like any other, so the fit objective stays convex and the engine the same."""

    weight: float
    floor: torch.Tensor | None  # [V]

    def probabilities(self, p0: torch.Tensor, out=None, floor: CacheFloor | None = None, scale=None) -> torch.Tensor:
        """The mixture [V, c] from the model's p0 [V, c] (up to a factor per token) and the chunk's
        neural-cache `floor`, normalized (into `out`): p0 scale + floor in one pass over the block, with
        scale = weight / Σ_v p0 per token (the chunk's, computed once by Tokens.mixed; else here)."""
        scale = (self.weight / p0.sum(dim=0) if scale is None else scale.to(p0))[None, :]
        if self.floor is None:
            out = torch.mul(p0, scale, out=out)
        else:
            out = torch.addcmul(self.floor.to(p0)[:, None], p0, scale, out=out)
        return out if floor is None else out.index_add_(0, floor.support, floor.values.to(p0))

    def nll(self, nll0: torch.Tensor, targets: torch.Tensor, floor: CacheFloor | None = None) -> torch.Tensor:
        """-log p(y_t) [c] from the model's NLL of the targets, in log space (a model probability that
        underflows leaves the floor)."""
        mass = torch.zeros(len(targets), dtype=torch.float64, device=nll0.device)
        if self.floor is not None:
            mass += self.floor.to(nll0.device, torch.float64)[targets]
        if floor is not None:
            mass += floor.at(targets)
        log_weight = torch.log(torch.tensor(self.weight, dtype=torch.float64))
        return -torch.logaddexp(log_weight - nll0.double(), mass.log()).to(nll0.dtype)


@dataclass(eq=False)
class Stack:
    """A lockstep group's splits side by side (prepare_stack): one p0 [V, N] whose columns are each split's
    tokens in turn, so that a round evaluates all of its users as one computation (uph.lm.engine.round).
    Each split's Tokens views its columns (Tokens.stack, Tokens.start)."""

    p0: torch.Tensor  # [V, N]
    hidden: torch.Tensor  # [N, H]
    derived: dict = field(default_factory=dict, repr=False)  # what rounds compute once (uph.lm.engine.round)

    @property
    def n(self) -> int:
        return self.p0.shape[1]


@dataclass
class Tokens:
    """A split's tokens with the base distribution of each token, cached within a memory budget: the
    model's (p0), or its mixture with caches (`mixture`: see Mixture). Tokens of a Stack (prepare_stack)
    are its columns start..start + n - 1."""

    chunks: list[Chunk]
    layer: OutputLayer  # on the tokens' device, in the compute dtype
    mixture: Mixture | None = None
    stack: Stack | None = None
    start: int = 0

    @property
    def n(self) -> int:
        return sum(len(chunk.targets) for chunk in self.chunks)

    @property
    def device(self) -> torch.device:
        return self.layer.W.device

    @property
    def dtype(self) -> torch.dtype:
        return self.layer.W.dtype

    @property
    def base_nll(self) -> float:
        return float(sum(chunk.nll0.sum(dtype=torch.float64) for chunk in self.chunks) / self.n)

    def probabilities(self, indices=None):
        """(chunk, p0 [V, c] up to a factor per token) for every chunk (or the chunks `indices`), from the
        cache or recomputed. With a mixture, its probabilities as `mixed` kept them, or else the model's p0
        mixed as it is read, into one reused block, valid until the next chunk's."""
        block = None
        for chunk in self.chunks if indices is None else [self.chunks[i] for i in indices]:
            if chunk.mixed is not None:
                yield chunk, chunk.mixed
                continue
            p0 = chunk.p0 if chunk.p0 is not None else base_distribution(chunk, self.layer)[0]
            if self.mixture is not None:
                if block is None:
                    block = p0.new_empty(p0.shape[0] * max(len(each.targets) for each in self.chunks))
                p0 = self.mixture.probabilities(p0, block[: p0.numel()].view(p0.shape), chunk.floor, chunk.scale)
            yield chunk, p0

    def base_logits(self, chunk: Chunk, rows: torch.Tensor) -> torch.Tensor:
        """The base's logits [V, k] of a chunk's tokens `rows`: the model's, or the log of the mixture."""
        z = base_logits(chunk.hidden[rows], self.layer)
        if self.mixture is None:
            return z
        floor = None if chunk.floor is None else chunk.floor.columns(rows)
        return self.mixture.probabilities(z.sub_(z.amax(dim=0, keepdim=True)).exp_(), floor=floor).log_()

    def mixed(self, mixture: Mixture, floors: list[CacheFloor] | None = None, budget: float = MIXED_BYTES) -> Tokens:
        """The same tokens on the base `mixture` of the model with caches (`floors`: each chunk's neural
        cache part, uph.lm.engine.neural_cache.floors). The mixture's probabilities of the chunks whose p0
        is cached are computed here and kept, within `budget` bytes (every evaluation of a path reads them,
        where mixing them as read costs a pass over p0 each time); the other chunks share the model's p0,
        mixed as it is read (`probabilities`). The same numbers either way."""
        if self.mixture is not None:
            raise ValueError("these tokens already have a mixture base")
        floor = None if mixture.floor is None else mixture.floor.to(self.device)  # read with every chunk
        mixture, floors = Mixture(mixture.weight, floor), floors or [None] * len(self.chunks)
        scales = [mixture.weight / p0.sum(dim=0) for _, p0 in self.probabilities()]  # a pass over p0, once
        chunks = []
        for chunk, cache, scale in zip(self.chunks, floors, scales, strict=True):
            nll = mixture.nll(chunk.nll0, chunk.targets, cache)
            chunks.append(Chunk(chunk.hidden, chunk.targets, nll, chunk.p0, cache, scale))
            if chunk.p0 is not None and chunk.p0.numel() * chunk.p0.element_size() <= budget:
                chunks[-1].mixed = mixture.probabilities(chunk.p0, None, cache, scale)
                budget -= chunks[-1].mixed.numel() * chunks[-1].mixed.element_size()
        return Tokens(chunks, self.layer, mixture)

    def prefix(self, n: int) -> Tokens:
        """The first n tokens (views of the same chunks and caches)."""
        return self.slice(0, n)

    def slice(self, start: int, stop: int) -> Tokens:
        """Tokens start..stop-1 (views of the same chunks and caches)."""
        chunks, offset = [], 0
        for chunk in self.chunks:
            c = len(chunk.targets)
            a, b = max(start - offset, 0), min(stop - offset, c)
            if a < b:
                p0 = None if chunk.p0 is None else chunk.p0[:, a:b]
                floor = None if chunk.floor is None else chunk.floor.columns(slice(a, b))
                scale = None if chunk.scale is None else chunk.scale[a:b]
                mixed = None if chunk.mixed is None else chunk.mixed[:, a:b]
                chunks.append(Chunk(chunk.hidden[a:b], chunk.targets[a:b], chunk.nll0[a:b], p0, floor, scale, mixed))
            offset += c
        return Tokens(chunks, self.layer, self.mixture, self.stack, self.start + start)


def validation_split(train: Tokens, fraction: float, gap: int) -> tuple[Tokens, Tokens]:
    """(fit part, validation part) of a user's train tokens, split in time as train and test are: the
    last ceil(fraction n) tokens validate, and the `gap` tokens before them (extract.context: a window's
    worth) belong to neither, so no validation token's context window holds the fit part's last targets."""
    fit_end, start = split_lengths(train.n, fraction, gap)
    return train.prefix(fit_end), train.slice(start, train.n)


def base_logits(hidden: torch.Tensor, layer: OutputLayer) -> torch.Tensor:
    """z0 = OutputLayer.logits(h), vocabulary-major [V, c] (the layout every pass walks)."""
    z = layer.W @ hidden.to(layer.W.dtype).T
    if layer.b is not None:
        z += layer.b[:, None]
    if layer.softcap is not None:
        z = z.div_(layer.softcap).tanh_().mul_(layer.softcap)
    return z


def base_distribution(chunk: Chunk, layer: OutputLayer):
    """exp(z0 - max z0) [V, c] (p0 up to a factor per token, which every use divides out: see
    Objective), and the base cross-entropy of the targets [c], as a log-sum-exp."""
    z = base_logits(chunk.hidden, layer)
    top = z.amax(dim=0, keepdim=True)
    target = z.gather(0, chunk.targets[None, :])
    unnormalized = z.sub_(top).exp_()
    nll0 = (top + unnormalized.sum(dim=0, keepdim=True).log() - target).squeeze(0)
    return unnormalized, nll0


def on_device(layer: OutputLayer, device: torch.device | str) -> OutputLayer:
    """The output layer as the engine computes with it: on `device`, contiguous, float32 (float64 if W is
    float64); `layer` itself when it already is. A job makes this one copy and hands it to every `prepare`,
    so all its Tokens share one W (V H floats: 113 MB at V = 49152, H = 576; 0.9 GB at a 1.5B model's)."""
    dtype = torch.float64 if layer.W.dtype == torch.float64 else torch.float32
    W = layer.W.to(device, dtype).contiguous()
    b = None if layer.b is None else layer.b.to(device, dtype)
    return layer if W is layer.W and b is layer.b else OutputLayer(W, b, layer.softcap)


def prepare(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    layer: OutputLayer,
    cache_bytes: float = 4 * 2**30,
    chunk: int | None = None,
    device: torch.device | str = "cpu",
) -> Tokens:
    """A split's tokens (hidden [n, H], targets [n]) on `device` in chunks of `chunk` tokens (default:
    chunk_size), p0 cached for up to `cache_bytes`. They compute with on_device(layer, device): `layer`
    itself where a job has made it so once, so that all its Tokens share one W (a layer elsewhere or in
    another dtype is copied for these tokens alone, and `pool` refuses to mix such copies).

    Chunks beyond the budget recompute p0 through the lm_head whenever they are used. Everything
    computes in float32 (float64 if the layer's W is float64)."""
    W = layer.W
    if hidden.shape[0] != targets.shape[0] or hidden.shape[1] != W.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)}, targets {tuple(targets.shape)} and W {tuple(W.shape)} do not fit together"
        )
    layer = on_device(layer, device)
    chunk, chunks, budget = chunk or chunk_size(device), [], cache_bytes
    for start in range(0, hidden.shape[0], chunk):
        piece = Chunk(
            hidden[start : start + chunk].to(device), targets[start : start + chunk].to(device).long(), None, None
        )
        p0, piece.nll0 = base_distribution(piece, layer)
        if p0.numel() * p0.element_size() <= budget:
            piece.p0, budget = p0, budget - p0.numel() * p0.element_size()
        chunks.append(piece)
    return Tokens(chunks, layer)


def prepare_stack(
    splits: list[tuple[torch.Tensor, torch.Tensor]],
    layer: OutputLayer,
    chunk: int | None = None,
    device: torch.device | str = "cpu",
) -> list[Tokens]:
    """The splits (hidden [n_i, H], targets [n_i]) as `prepare` makes them, p0 always cached, their columns
    side by side in one Stack: p0 [V, Σ n_i], each split's chunks views of its columns. A lockstep group's
    users (uph.lm.engine.lockstep.lockstep_groups sizes them within its budget) as one computation a round."""
    layer = on_device(layer, device)
    hidden = torch.cat([h for h, _ in splits]).to(device)
    if hidden.shape[1] != layer.W.shape[1] or any(len(h) != len(y) for h, y in splits):
        raise ValueError(f"hidden states and targets of {len(splits)} splits do not fit W {tuple(layer.W.shape)}")
    stack = Stack(torch.empty(layer.W.shape[0], len(hidden), dtype=layer.W.dtype, device=device), hidden)
    chunk, start, split_tokens = chunk or chunk_size(device), 0, []
    for _, targets in splits:
        chunks = []
        for a in range(start, start + len(targets), chunk):
            b = min(a + chunk, start + len(targets))
            piece = Chunk(hidden[a:b], targets[a - start : b - start].to(device).long(), None, stack.p0[:, a:b])
            p0, piece.nll0 = base_distribution(piece, layer)
            piece.p0.copy_(p0)
            chunks.append(piece)
        split_tokens.append(Tokens(chunks, layer, stack=stack, start=start))
        start += len(targets)
    return split_tokens


def prepare_halves(
    splits: list[tuple[torch.Tensor, torch.Tensor]],
    layer: OutputLayer,
    chunk: int | None = None,
    device: torch.device | str = "cpu",
) -> list[Tokens]:
    """prepare_stack of the splits in two Stacks, the first half's and the second's: a lockstep group whose
    halves' rounds alternate (uph.lm.engine.lockstep), the host working on one while the device computes
    the other."""
    middle = (len(splits) + 1) // 2
    return [
        tokens
        for half in (splits[:middle], splits[middle:])
        if half
        for tokens in prepare_stack(half, layer, chunk, device)
    ]


def pool(splits: list[Tokens]) -> Tokens:
    """All the splits' tokens as one (the pooled `global` theta), sharing their caches and their one output
    layer (the model's base)."""
    if any(split.mixture is not None for split in splits):
        raise ValueError("pool takes tokens on the model's base")
    if any(split.layer.W is not splits[0].layer.W for split in splits):
        raise ValueError("pool takes tokens that share one output layer (on_device, once per job)")
    return Tokens([chunk for split in splits for chunk in split.chunks], splits[0].layer)
