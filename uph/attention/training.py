"""Training and evaluation of one cell of the attention study: a (task, model, attention kind).

Each kind gets its own learning-rate sweep: every lr of `lrs` trains on the first `sweep_seeds`
seeds; of the lrs those seeds do not separate from the one of the best mean validation token accuracy,
the middle wins (best_lr; an lr with a diverged run never wins) and is the cell's lr, and the remaining
seeds train at it only. While the chosen lr is an end of the lrs tried, the sweep tries one more
`lr_step` beyond it, up to `lr_extensions` times (never above 1); a choice still at an end is flagged
`lr_at_edge` (low, high, or both when only one lr was tried), so a budget-bound "best" lr is never taken
for an optimum. The runs at the chosen lr are then tested at train_len and every eval factor times it,
on each level of the task (uph.attention.tasks.levels). Where the runs at the chosen lr split (some
solve the task's validation set, token accuracy >= SOLVED, some do not: a bimodal kind, whose mean over
a few seeds float32 rounding can swing), the cell trains more seeds at that lr, up to `seeds_if_split`
in all (split_seeds), so its mean, interval and share of seeds solved rest on enough seeds to agree
across machines. A kind of `split_kinds` (the config's bimodal kinds) sweeps every lr on all of `seeds`,
not the first `sweep_seeds`, and always trains the seeds after them up to `seeds_if_split` at the chosen
lr only: whether it gets them is the config's decision, not a rounding's, and its lr is chosen on five
seeds in the default, which keep every choice that ten make on the recorded sweeps (three do not:
docs/study.md). Validation and test sets are disjoint streams of fresh sequences: training batches come
from a generator seeded with the seed, validation from seed * STREAM + 1, the test set of (length, level
index i) from seed * STREAM + 2 + 64 * length + i.

AdamW, linear warmup over `warmup` of `max_steps`, then constant or cosine decay to 0 at max_steps
(`schedule`), every kind's gradient clipped to global norm `grad_clip`; the loss is the mean
cross-entropy over scored targets. A run trains to convergence: it stops as solved once its validation
token accuracy has been at least `solved_accuracy` on `solved_evaluations` evaluations in a row (its
validation set shows nothing more to learn), once its validation loss has not fallen by `min_delta` for
`patience` evaluations, or at its step limit (`at_step_limit`): `max_steps`, or for a run still improving
there `max_steps_extended` (it trains on at the schedule's last lr). Whichever stop, it keeps the weights
of its best evaluation (the lowest validation loss); its rows report why it stopped (`stopped`, one of
study_config.STOPS), the steps run, the best step and the first logged steps at 0.9 and 0.99 validation
token accuracy (sample efficiency; NaN if never). Every `log_every` steps a curve row holds the mean
training loss since the last row, the validation loss and token accuracy, the mean |score| over causal
entries of every attention layer on `probe_size` validation sequences (score_abs, mean over layers) and
the L2 norm of the gradient of all attention weights at that step before clipping (attention_grad_norm);
the row of step s reads the model after s updates. A NaN or inf training loss ends the run as diverged.

A split kind's sweep can also train as one job per lr (train_lr; the workflow's attention_lr jobs, so that
16 cores train a long cell's lrs side by side): run_cell then starts from their runs (`swept`) and trains
what follows. A run's arithmetic does not depend on the other runs of its batch, so the tables are the
same to the byte either way (tests/test_attention_study.py).

The runs of a stage (the sweep's lrs x sweep seeds, an extension's sweep seeds, the remaining seeds and,
where the sweep seeds already split or the kind is of split_kinds, the added ones) train at once as one
model of R runs (train_runs, uph.attention.runs): each keeps its own initial weights, batches, lr, Adam
moments, clipping, early stopping and best weights, so it is the run it would be alone up to float32
rounding; a run that stops (solved, out of patience, diverged) leaves the batch. On a GPU, a step other
than a logging one is one launch of a CUDA graph (uph.attention.steps).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import pandas as pd
import torch

from uph.attention.model import attention_stats, build_model
from uph.attention.runs import RunAdamW, load_runs, run_state
from uph.attention.self_attention import KINDS
from uph.attention.steps import TrainSteps, run_losses, stacked
from uph.attention.study_config import PROGRESS, SOLVED, TIE, AttentionStudyConfig, eval_lengths, schedule, step_limit
from uph.attention.tasks import IGNORE, Batch, levels, make_batch
from uph.errors import TrainingDivergedError
from uph.stats import SIGNIFICANCE, welch_interval

STREAM = 1_000_003
log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batch: Batch, chunk: int) -> list[dict[str, float]]:
    """Per run of `model`: loss, token accuracy and sequence accuracy (every scored target right) on the
    scored targets of its own sequences (batch [R, N, T])."""
    model.eval()
    logits = torch.cat(
        [model(inputs, loud).float() for inputs, loud in zip(batch.inputs.split(chunk, 1), batch.loud.split(chunk, 1))],
        dim=1,
    )
    model.train()
    scored = batch.targets != IGNORE
    right = (logits.argmax(-1) == batch.targets) | ~scored
    losses = run_losses(logits, batch.targets)
    token_acc = (right & scored).flatten(1).sum(1) / scored.flatten(1).sum(1)
    seq_acc = right.all(dim=-1).float().mean(-1)
    return [
        {"loss": loss, "token_acc": token, "seq_acc": seq}
        for loss, token, seq in zip(losses.tolist(), token_acc.tolist(), seq_acc.tolist())
    ]


def first_step(rows: list[dict], accuracy: float) -> float:
    """The first logged step whose validation token accuracy reaches `accuracy`, NaN if none did."""
    return next((row["step"] for row in rows if row["val_token_acc"] >= accuracy), math.nan)


@dataclass
class RunResult:
    """One run's outcome: its best weights (uph.attention.runs.run_state), curve rows, that evaluation's
    validation metrics, whether it diverged, and PROGRESS's values."""

    state: dict[str, torch.Tensor]
    rows: list[dict]
    final: dict[str, float]
    diverged: bool
    progress: dict


@dataclass
class RunProgress:
    """One run of train_runs so far: its curve rows, the row of its lowest validation loss and its weights
    there, the evaluations since without a fall of min_delta, the evaluations in a row at solved_accuracy,
    and its RunResult once it stops."""

    rows: list[dict] = field(default_factory=list)
    best: dict | None = None
    best_state: dict[str, torch.Tensor] | None = None
    waited: int = 0
    solved: int = 0
    result: RunResult | None = None


def train_runs(
    cfg: AttentionStudyConfig,
    task: str,
    model_name: str,
    attention: str,
    runs: list[tuple[float, int]],
    device: torch.device,
) -> list[RunResult]:
    """Train the runs (lr, seed) at once, each to convergence as it would train alone (uph.attention.runs:
    its own initial weights, data stream, lr, moments, clipping, early stopping and best weights); a run
    that stops leaves the batch. Returns each run's RunResult, in order."""
    seeds = [seed for _, seed in runs]
    model = build_model(model_name, attention, cfg, seeds).to(device)
    optimizer = RunAdamW(model, [lr for lr, _ in runs], cfg.weight_decay)  # holds the weights from here on
    trainer = TrainSteps(model, optimizer, cfg.grad_clip, device)  # on a GPU, a step is one graph launch
    factor = schedule(cfg)
    streams = [torch.Generator().manual_seed(seed) for seed in seeds]
    L, limit = cfg.train_len, step_limit(cfg)
    val = stacked(
        [make_batch(task, cfg, cfg.eval_size, L, torch.Generator().manual_seed(seed * STREAM + 1)) for seed in seeds],
        device,
    )
    progress = [RunProgress() for _ in runs]
    active = list(range(len(runs)))  # the runs still training, in the model's run order
    running = torch.zeros(len(runs), device=device)  # the training losses' sum since the last row
    since = 0
    for step in range(1, limit + 1):
        batches = [make_batch(task, cfg, cfg.batch_size, L, streams[i]) for i in active]
        logging_step = step % cfg.log_every == 0 or step in (cfg.max_steps, limit)
        losses, grad_norm = trainer(batches, factor(step - 1), logging_step)
        running += losses
        since += 1
        if not logging_step:
            continue
        grad_norm = grad_norm.tolist()
        train_loss, since = (running / since).tolist(), 0
        running.zero_()
        logged = [(runs[i], progress[i]) for i in active]
        done = log_step(cfg, model, val, step, logged, train_loss, grad_norm)
        if done:
            keep = [j for j in range(len(active)) if j not in done]
            active = [active[j] for j in keep]
            if not active:
                break
            index = torch.tensor(keep, device=device)
            trainer.keep_runs(index)
            val, running = Batch(*(t[index] for t in val)), running[index]
    for i in active:  # every step taken, no stop met
        progress[i].result = _converged(progress[i], step, "step_limit")
    if trainer.captured:
        log.info("%d of %d steps replayed from %d CUDA graph(s)", trainer.replayed, step, trainer.captured)
    return [run.result for run in progress]


def log_step(
    cfg: AttentionStudyConfig,
    model: torch.nn.Module,
    val: Batch,
    step: int,
    logged: list[tuple[tuple[float, int], RunProgress]],
    train_loss: list[float],
    grad_norm: list[float],
) -> list[int]:
    """A logging step of the runs still training (`logged`: each (lr, seed) and its RunProgress, in the
    model's run order): a curve row for each, its best weights kept where its validation loss fell, and a
    result for each run that stops here (diverged, solved: solved_evaluations evaluations in a row at
    solved_accuracy, or out of patience). Returns the stopped runs' places in `logged`."""
    metrics = evaluate(model, val, cfg.batch_size)
    stats = attention_stats(model, val.inputs[:, : cfg.probe_size], val.loud[:, : cfg.probe_size])
    done = []
    for j, ((lr, seed), run) in enumerate(logged):
        finite = math.isfinite(train_loss[j])
        run.rows.append(
            {
                "lr": lr,
                "seed": seed,
                "step": step,
                "train_loss": train_loss[j],
                "val_loss": metrics[j]["loss"] if finite else math.nan,
                "val_token_acc": metrics[j]["token_acc"] if finite else math.nan,
                "score_abs": stats["score_abs"][j],
                "attention_grad_norm": grad_norm[j],
            }
        )
        if not finite:
            run.result = _diverged(run, run_state(model, j), step)
            done.append(j)
            continue
        row = run.rows[-1]
        if run.best is None or row["val_loss"] < run.best["val_loss"] - cfg.min_delta:
            run.best, run.best_state, run.waited = row, run_state(model, j), 0
        else:
            run.waited += 1
        solved = cfg.solved_accuracy is not None and row["val_token_acc"] >= cfg.solved_accuracy
        run.solved = run.solved + 1 if solved else 0
        stop = "solved" if run.solved >= cfg.solved_evaluations else "patience" if run.waited >= cfg.patience else ""
        if stop:
            run.result = _converged(run, step, stop)
            done.append(j)
    return done


def _diverged(run: RunProgress, state: dict[str, torch.Tensor], step: int) -> RunResult:
    progress = {
        "steps_run": step,
        "best_step": math.nan,
        "steps_to_90": math.nan,
        "steps_to_99": math.nan,
        "at_step_limit": False,
        "stopped": "diverged",
    }
    return RunResult(state, run.rows, {"val_loss": math.nan, "val_token_acc": math.nan}, True, progress)


def _converged(run: RunProgress, step: int, stopped: str) -> RunResult:
    """The run's result at `step`, its best evaluation's weights and metrics; `stopped`: solved, patience or
    step_limit (study_config.STOPS)."""
    progress = {
        "steps_run": step,
        "best_step": run.best["step"],
        "steps_to_90": first_step(run.rows, 0.9),
        "steps_to_99": first_step(run.rows, 0.99),
        "at_step_limit": stopped == "step_limit",
        "stopped": stopped,
    }
    final = {"val_loss": run.best["val_loss"], "val_token_acc": run.best["val_token_acc"]}
    return RunResult(run.best_state, run.rows, final, False, progress)


def best_lr(sweep: pd.DataFrame) -> float | None:
    """The cell's lr: among lrs none of whose runs diverged, those the sweep's seeds do not separate from
    the lr of the best mean validation token accuracy tie; of them, the middle one (by lr; of two middles,
    the higher). None when every lr has a diverged run.

    An lr is separated from the best when its mean is lower by more than TIE with 95 % confidence: the
    lower end of Welch's 90 % interval of (best - lr) lies above TIE (with one seed a side, the difference
    itself). Means are not enough: where runs split (some seeds solve, some stall), which seeds split moves
    with a CPU's rounding, and with it the best mean; lrs that the seeds cannot tell apart tie, and a fixed
    preference, not rounding, picks among them. The middle keeps the choice inside the tie, so an lr that
    merely ties never pulls the sweep past an end; of two, the higher converges in fewer steps. A split
    kind (run_cell) sweeps on all of the config's seeds, so its lrs are told apart on five seeds in the
    default, not three."""
    ok = sweep.groupby("lr").filter(lambda runs: not runs["diverged"].any())
    if ok.empty:
        return None
    accuracy = {lr: runs["val_token_acc"].to_numpy() for lr, runs in ok.groupby("lr")}
    best = accuracy[max(accuracy, key=lambda lr: accuracy[lr].mean())]
    tied = sorted(lr for lr, runs in accuracy.items() if not separated(best, runs))
    return float(tied[len(tied) // 2])


def separated(best, runs, margin: float = TIE) -> bool:
    """Whether the seeds put the accuracies `runs` more than `margin` below `best` with 95 % confidence: the
    lower end of Welch's 90 % interval of mean(best) - mean(runs) above `margin`; with one seed a side, the
    difference itself."""
    if min(len(best), len(runs)) < 2:
        return best.mean() - runs.mean() > margin
    return welch_interval(best, runs, 1 - 2 * SIGNIFICANCE)[1] > margin


def split_seeds(sweep: pd.DataFrame, lr: float, seeds: list[int], wanted: int | None) -> list[int]:
    """The seeds to add to `seeds` (max(seeds) + 1, ...) until there are `wanted`, where the runs at `lr`
    split: some solve the task's validation set (token accuracy >= SOLVED) and some do not (diverged runs
    count as not). [] where they agree, or `wanted` is None."""
    runs = sweep[sweep["lr"] == lr]
    solved = (runs["val_token_acc"] >= SOLVED) & ~runs["diverged"]
    if solved.all() or not solved.any():
        return []
    return seeds_to_add(seeds, wanted)


def seeds_to_add(seeds, wanted: int | None) -> list[int]:
    """The seeds after `seeds` (max(seeds) + 1, ...) up to `wanted` in all ([] for None): a split cell's."""
    return [] if wanted is None else list(range(max(seeds) + 1, max(seeds) + 1 + wanted - len(seeds)))


def lr_edge(lr: float, tried) -> str:
    """Where `lr` sits among the lrs `tried`: "low" or "high" at an end, "both" if it is the only one,
    "" inside."""
    low, high = lr == min(tried), lr == max(tried)
    return "both" if low and high else "low" if low else "high" if high else ""


def extension(lr: float, tried, step: float) -> float | None:
    """The lr one `step` past the end of `tried` that `lr` sits at, or None: inside, only one lr tried
    (no direction), or above 1."""
    edge = lr_edge(lr, tried)
    if edge == "low":
        return lr / step
    if edge == "high" and lr * step <= 1:
        return lr * step
    return None


def test_sets(task: str, cfg: AttentionStudyConfig, seed: int) -> dict[tuple[int, float], Batch]:
    """(eval length, level) -> the fixed test batch of `eval_size` sequences."""
    return {
        (length, level): make_batch(
            task, cfg, cfg.eval_size, length, torch.Generator().manual_seed(seed * STREAM + 2 + 64 * length + i), level
        )
        for length in eval_lengths(cfg)
        for i, level in enumerate(levels(task, cfg))
    }


@dataclass(frozen=True)
class Cell:
    """What a cell trains (a task, model and attention kind under `cfg`), where, and the logger of its lines."""

    cfg: AttentionStudyConfig
    task: str
    model_name: str
    attention: str
    device: torch.device
    log: logging.Logger

    @property
    def name(self) -> str:
        return f"{self.task} {self.model_name} {self.attention}"

    @property
    def columns(self) -> dict[str, str]:
        return {"task": self.task, "model": self.model_name, "attention": self.attention}


@dataclass(frozen=True)
class Recorded:
    """A cell's runs in the order the protocol asked for them: their curve rows, sweep rows (one a run) and
    best weights by (lr, seed); and the runs trained ahead (`spare`), held until it asks for them."""

    curves: list[dict] = field(default_factory=list)
    sweep: list[dict] = field(default_factory=list)
    states: dict[tuple[float, int], dict] = field(default_factory=dict)
    spare: dict[tuple[float, int], RunResult] = field(default_factory=dict)


def train_stage(
    cell: Cell, recorded: Recorded, runs: list[tuple[float, int]], later: list[tuple[float, int]] = ()
) -> Recorded:
    """`recorded` with the runs (lr, seed) after it: those not trained ahead train at once (train_runs),
    together with `later`, the runs a later stage will ask for."""
    start = time.perf_counter()
    spare = dict(recorded.spare)
    todo = [run for run in [*runs, *later] if run not in spare]
    if todo:
        spare.update(zip(todo, train_runs(cell.cfg, cell.task, cell.model_name, cell.attention, todo, cell.device)))
        cell.log.info("%s: %d runs at once in %.1f s", cell.name, len(todo), time.perf_counter() - start)
    results = {run: spare.pop(run) for run in runs}
    for (lr, seed), result in results.items():
        cell.log.info(
            "%s lr %g seed %d: val token acc %.4f after %d steps (stopped: %s)",
            cell.name,
            lr,
            seed,
            result.final["val_token_acc"],
            result.progress["steps_run"],
            result.progress["stopped"],
        )
    return Recorded(
        [*recorded.curves, *(row for result in results.values() for row in result.rows)],
        [
            *recorded.sweep,
            *(
                {"lr": lr, "seed": seed, **result.final, "diverged": result.diverged, **result.progress}
                for (lr, seed), result in results.items()
            ),
        ],
        {**recorded.states, **{run: result.state for run, result in results.items()}},
        spare,
    )


def sweep_lrs(
    cell: Cell, sweep_seeds: list[int], later_seeds: list[int], swept: Recorded | None = None
) -> tuple[Recorded, list[float]]:
    """The lr sweep on `sweep_seeds`: every lr of the config's (`later_seeds` trained ahead at each; `swept`:
    those runs trained already, by train_lr), then, while the best lr is an end of those tried, one lr_step
    past it, up to lr_extensions times. Returns the runs and the lrs tried."""
    cfg = cell.cfg
    tried = list(cfg.lrs)
    runs = [(lr, seed) for lr in tried for seed in sweep_seeds]
    if swept is None:
        recorded = train_stage(cell, Recorded(), runs, [(lr, seed) for lr in tried for seed in later_seeds])
    elif [(row["lr"], row["seed"]) for row in swept.sweep] == runs:
        recorded = swept
    else:
        raise ValueError(f"{cell.name}: the lr jobs' runs are not the sweep's {runs}")
    for _ in range(cfg.lr_extensions):
        chosen = best_lr(pd.DataFrame(recorded.sweep))
        lr = None if chosen is None else extension(chosen, tried, cfg.lr_step)
        if lr is None:
            break
        cell.log.info("%s: the best lr %g is an end of %s; trying %g", cell.name, chosen, tried, lr)
        tried = [*tried, lr]
        recorded = train_stage(cell, recorded, [(lr, seed) for seed in sweep_seeds])
    return recorded, tried


def chosen_lr(cell: Cell, recorded: Recorded) -> float:
    """The cell's lr (best_lr of its sweep); TrainingDivergedError when every lr has a diverged run."""
    chosen = best_lr(pd.DataFrame(recorded.sweep))
    if chosen is None:
        raise TrainingDivergedError(
            f"{cell.task} with the {cell.model_name} model and {cell.attention} attention: every lr has a "
            f"diverged run; lower config key 'attention.lrs' ({list(cell.cfg.lrs)})"
        )
    return chosen


def add_seeds(
    cell: Cell, recorded: Recorded, chosen: float, sweep_seeds: list[int], split_kind: bool
) -> tuple[Recorded, list[int]]:
    """The config's seeds the sweep left out, at the chosen lr, and the seeds added up to seeds_if_split: for
    a kind of split_kinds always (the config's decision), else where the runs at the chosen lr split
    (split_seeds). Runs that split on the sweep seeds split on every seed, so there the added seeds train in
    the remaining seeds' stage (one stage less); elsewhere the split is read once the remaining seeds are in.
    Returns the runs and every seed at the chosen lr."""
    remaining = [seed for seed in cell.cfg.seeds if seed not in sweep_seeds]
    seeds = [*sweep_seeds, *remaining]
    if split_kind:
        extra = seeds_to_add(seeds, cell.cfg.seeds_if_split)
    else:  # split on the sweep seeds already
        extra = split_seeds(pd.DataFrame(recorded.sweep), chosen, seeds, cell.cfg.seeds_if_split)
        if extra:
            cell.log.info(
                "%s: its sweep seeds split at lr %g; training seeds %s with %s", cell.name, chosen, extra, remaining
            )
    if remaining or extra:
        recorded = train_stage(cell, recorded, [(chosen, seed) for seed in [*remaining, *extra]])
    if remaining and not extra and not split_kind:  # a split the remaining seeds show
        extra = split_seeds(pd.DataFrame(recorded.sweep), chosen, seeds, cell.cfg.seeds_if_split)
        if extra:
            cell.log.info("%s: its seeds split at lr %g; training seeds %s", cell.name, chosen, extra)
            recorded = train_stage(cell, recorded, [(chosen, seed) for seed in extra])
    return recorded, [*seeds, *extra]


def evaluation_rows(cell: Cell, recorded: Recorded, chosen: float, edge: str, seeds: list[int]) -> list[dict]:
    """Every seed's best weights at the chosen lr on its test sets (test_sets): a row per (seed, eval length,
    level), by seed, with the run's validation accuracy and PROGRESS; a diverged run's metrics NaN."""
    cfg, kind = cell.cfg, KINDS[cell.attention]
    marks = {"family": kind.family, "loudness_invariant": kind.loudness_invariant}
    final = pd.DataFrame(recorded.sweep).set_index(["lr", "seed"])
    states = [recorded.states[chosen, seed] for seed in seeds]
    model = load_runs(build_model(cell.model_name, cell.attention, cfg, seeds), states).to(cell.device)
    tests = [test_sets(cell.task, cfg, seed) for seed in seeds]
    rows = []
    for key in tests[0]:  # (length, level); every seed's test batch of it at once
        metrics = evaluate(model, stacked([sets[key] for sets in tests], cell.device), cfg.batch_size)
        for seed, seed_metrics in zip(seeds, metrics):
            validation = final.loc[(chosen, seed)]
            if validation["diverged"]:  # a diverged model's argmax is noise, not an accuracy
                seed_metrics = dict.fromkeys(("loss", "token_acc", "seq_acc"), math.nan)
            rows.append(
                {
                    **cell.columns,
                    "lr": chosen,
                    "lr_at_edge": edge,
                    "seed": seed,
                    "train_len": cfg.train_len,
                    "eval_len": key[0],
                    "level": key[1],
                    **seed_metrics,
                    "val_token_acc": validation["val_token_acc"],
                    "diverged": bool(validation["diverged"]),
                    **marks,
                    **{name: validation[name] for name in PROGRESS},
                }
            )
    rows.sort(key=lambda row: seeds.index(row["seed"]))  # by seed, then length and level, as before
    return rows


def run_cell(
    cfg: AttentionStudyConfig,
    task: str,
    model_name: str,
    attention: str,
    device: torch.device,
    log: logging.Logger | None = None,
    ahead: bool | None = None,
    swept: Recorded | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The lr sweep, the remaining seeds at the chosen lr, and the tests: (curves, sweep, evaluation).
    Each stage trains its runs at once (train_runs): the sweep's lrs x sweep seeds (the first sweep_seeds
    seeds; a kind of split_kinds: all of seeds), each extension's sweep seeds, the remaining seeds with the
    added seeds where the sweep seeds split or the kind is of split_kinds (add_seeds), else the added seeds
    after them.

    `ahead` (default: on a GPU, which pays little for more runs a step) trains the later seeds (the
    remaining ones and those a split would add) at every lr of the first sweep within it, and keeps each
    run until the protocol asks for it: the lr is still chosen on the sweep seeds alone and the tables
    hold the same runs, but a cell whose lr is chosen among the config's lrs trains in one stage, not
    three. Each run is the run it would be in its own stage, up to float32 rounding.

    `swept`: a split kind's sweep over the config's lrs, trained already one job an lr (train_lr, then
    read_lr_jobs); the cell trains what follows it, and nothing ahead."""
    cell = Cell(cfg, task, model_name, attention, device, log or logging.getLogger(__name__))
    ahead = device.type == "cuda" and swept is None if ahead is None else ahead
    every_seed = [*cfg.seeds, *seeds_to_add(cfg.seeds, cfg.seeds_if_split)]
    split_kind = attention in cfg.split_kinds  # decided by the config, alike on every CPU
    sweep_seeds = list(cfg.seeds) if split_kind else list(cfg.seeds[: cfg.sweep_seeds])
    if split_kind:
        cell.log.info(
            "%s: a kind of attention.split_kinds; every lr on seeds %s, seeds %s at the chosen lr",
            cell.name,
            sweep_seeds,
            every_seed[len(sweep_seeds) :],
        )
    later = [seed for seed in every_seed if seed not in sweep_seeds] if ahead else []
    recorded, tried = sweep_lrs(cell, sweep_seeds, later, swept)
    chosen = chosen_lr(cell, recorded)
    edge = lr_edge(chosen, tried)
    recorded, seeds = add_seeds(cell, recorded, chosen, sweep_seeds, split_kind)
    rows = evaluation_rows(cell, recorded, chosen, edge, seeds)
    return (
        pd.DataFrame(recorded.curves).assign(**cell.columns),
        pd.DataFrame(recorded.sweep).assign(
            **cell.columns,
            chosen=lambda d: d["lr"] == chosen,
            extended=lambda d: ~d["lr"].isin(cfg.lrs),
            lr_at_edge=edge,
        ),
        pd.DataFrame(rows),
    )


def train_lr(
    cfg: AttentionStudyConfig,
    task: str,
    model_name: str,
    attention: str,
    lr: float,
    device: torch.device,
    log: logging.Logger | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, torch.Tensor]]:
    """One lr of a split kind's sweep: its runs on every seed of `seeds`, as (curves, sweep rows, each run's
    best weights {"<seed>/<name>": tensor}) for run_cell's `swept` (read_lr_jobs)."""
    if attention not in cfg.split_kinds or lr not in cfg.lrs:
        raise ValueError(f"an lr job trains an lr of attention.lrs {list(cfg.lrs)} of a kind of attention.split_kinds")
    cell = Cell(cfg, task, model_name, attention, device, log or logging.getLogger(__name__))
    recorded = train_stage(cell, Recorded(), [(lr, seed) for seed in cfg.seeds])
    weights = {f"{seed}/{name}": t for (_, seed), state in recorded.states.items() for name, t in state.items()}
    return pd.DataFrame(recorded.curves), pd.DataFrame(recorded.sweep), weights


def read_lr_jobs(jobs: list[tuple[pd.DataFrame, pd.DataFrame, dict[str, torch.Tensor]]]) -> Recorded:
    """The runs of train_lr's jobs, in order (the config's lrs), as the one sweep stage run_cell reads."""
    curves, sweep, states = [], [], {}
    for job_curves, job_sweep, weights in jobs:
        curves += job_curves.to_dict("records")
        sweep += job_sweep.to_dict("records")
        lr = float(job_sweep["lr"].iloc[0])
        for key, tensor in weights.items():
            seed, name = key.split("/", 1)
            states.setdefault((lr, int(seed)), {})[name] = tensor
    return Recorded(curves, sweep, states)
