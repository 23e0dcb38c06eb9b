"""Training and evaluation of one cell of the attention study: a (task, model, attention kind).

Each kind gets its own learning-rate sweep: every lr of `lrs` trains on the first `sweep_seeds`
seeds, the lr with the best mean validation token accuracy (ties: lower validation loss; an lr
with a diverged run never wins) is the cell's lr, and the remaining seeds train at it only. While
the best lr is an end of the lrs tried, the sweep tries one more `lr_step` beyond it, up to
`lr_extensions` times (never above 1); a choice still at an end is flagged `lr_at_edge` (low, high,
or both when only one lr was tried), so a budget-bound "best" lr is never taken for an optimum. The
runs at the chosen lr are then tested at train_len and every eval factor times it, on each level
of the task (uph.attention.tasks.levels). Validation and test sets are disjoint streams of fresh
sequences: training batches come from a generator seeded with the seed, validation from
seed * STREAM + 1, the test set of (length, level index i) from seed * STREAM + 2 + 64 * length + i.

AdamW, linear warmup over `warmup` of `max_steps`, then constant or cosine decay to 0 at max_steps
(`schedule`), every kind's gradient clipped to global norm `grad_clip`; the loss is the mean
cross-entropy over scored targets. A run trains to convergence: it stops once its validation loss has
not fallen by `min_delta` for `patience` evaluations, or at its step limit (`at_step_limit`): `max_steps`,
or for a run still improving there `max_steps_extended` (it trains on at the schedule's last lr), and keeps
the weights of its best evaluation; its rows report the steps run, the best step and the first logged
steps at 0.9 and 0.99 validation token accuracy (sample efficiency; NaN if never). Every `log_every` steps a curve row holds
the mean training loss since the last row, the validation loss and token accuracy, the mean
|score| over causal entries of every attention layer on `probe_size` validation sequences
(score_abs, mean over layers) and the L2 norm of the gradient of all attention weights at that
step before clipping (attention_grad_norm); the row of step s reads the model after s updates. A NaN or inf training loss ends the run as diverged.
"""

from __future__ import annotations

import copy
import logging
import math
import time

import pandas as pd
import torch
import torch.nn.functional as F

from uph.attention.model import attention_grad_norm, attention_stats, build_model
from uph.attention.self_attention import KINDS
from uph.attention.study_config import AttentionStudyConfig, eval_lengths, schedule, step_limit
from uph.attention.tasks import IGNORE, Batch, levels, make_batch
from uph.errors import TrainingDivergedError

STREAM = 1_000_003


@torch.no_grad()
def evaluate(model: torch.nn.Module, batch: Batch, chunk: int) -> dict[str, float]:
    """Loss, token accuracy and sequence accuracy (every scored target right) on the scored targets."""
    model.eval()
    logits = torch.cat(
        [model(inputs, loud).float() for inputs, loud in zip(batch.inputs.split(chunk), batch.loud.split(chunk))]
    )
    model.train()
    scored = batch.targets != IGNORE
    right = (logits.argmax(-1) == batch.targets) | ~scored
    return {
        "loss": F.cross_entropy(logits[scored], batch.targets[scored]).item(),
        "token_acc": (right & scored).sum().item() / scored.sum().item(),
        "seq_acc": right.all(dim=1).float().mean().item(),
    }


def _on(batch: Batch, device: torch.device) -> Batch:
    return Batch(*(t.to(device) for t in batch))


PROGRESS = ["steps_run", "best_step", "steps_to_90", "steps_to_99", "at_step_limit"]  # per run, in its rows


def first_step(rows: list[dict], accuracy: float) -> float:
    """The first logged step whose validation token accuracy reaches `accuracy`, NaN if none did."""
    return next((row["step"] for row in rows if row["val_token_acc"] >= accuracy), math.nan)


def train_run(
    cfg: AttentionStudyConfig, task: str, model_name: str, attention: str, lr: float, seed: int, device: torch.device
):
    """Train one run to convergence; returns (model at its best validation loss, curve rows, that
    evaluation's validation metrics, diverged, progress: PROGRESS's values)."""
    torch.manual_seed(seed)
    model = build_model(model_name, attention, cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(cfg))
    batches = torch.Generator().manual_seed(seed)
    L = cfg.train_len
    val = _on(make_batch(task, cfg, cfg.eval_size, L, torch.Generator().manual_seed(seed * STREAM + 1)), device)
    probe = Batch(*(t[: cfg.probe_size] for t in val))
    rows, running = [], []
    best, best_state, waited = None, None, 0  # best: the row of the lowest validation loss so far
    limit = step_limit(cfg)
    for step in range(1, limit + 1):
        batch = _on(make_batch(task, cfg, cfg.batch_size, L, batches), device)
        logits = model(batch.inputs, batch.loud)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        running.append(loss.detach())
        logging_step = step % cfg.log_every == 0 or step in (cfg.max_steps, limit)
        grad_norm = attention_grad_norm(model) if logging_step else math.nan  # before clipping
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        if not logging_step:
            continue
        train_loss = torch.stack(running).mean().item()
        running = []
        metrics = evaluate(model, val, cfg.batch_size) if math.isfinite(train_loss) else {}
        rows.append(
            {
                "lr": lr,
                "seed": seed,
                "step": step,
                "train_loss": train_loss,
                "val_loss": metrics.get("loss", math.nan),
                "val_token_acc": metrics.get("token_acc", math.nan),
                **attention_stats(model, probe.inputs, probe.loud),
                "attention_grad_norm": grad_norm,
            }
        )
        if not math.isfinite(train_loss):
            progress = dict(zip(PROGRESS, (step, math.nan, math.nan, math.nan, False)))
            return model, rows, {"val_loss": math.nan, "val_token_acc": math.nan}, True, progress
        if best is None or rows[-1]["val_loss"] < best["val_loss"] - cfg.min_delta:
            best, best_state, waited = rows[-1], copy.deepcopy(model.state_dict()), 0
        else:
            waited += 1
        if waited >= cfg.patience:
            break
    model.load_state_dict(best_state)
    progress = {
        "steps_run": step,
        "best_step": best["step"],
        "steps_to_90": first_step(rows, 0.9),
        "steps_to_99": first_step(rows, 0.99),
        "at_step_limit": waited < cfg.patience,
    }
    return model, rows, {"val_loss": best["val_loss"], "val_token_acc": best["val_token_acc"]}, False, progress


def best_lr(sweep: pd.DataFrame) -> float | None:
    """The lr with the best mean validation token accuracy over its seeds (ties: lower mean
    validation loss) among lrs none of whose runs diverged; None when every lr has a diverged run."""
    ok = sweep.groupby("lr").filter(lambda runs: not runs["diverged"].any())
    if ok.empty:
        return None
    means = ok.groupby("lr")[["val_token_acc", "val_loss"]].mean()
    return float(means.sort_values(["val_token_acc", "val_loss"], ascending=[False, True], kind="stable").index[0])


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


def test_sets(task: str, cfg: AttentionStudyConfig, seed: int, device: torch.device) -> dict[tuple[int, float], Batch]:
    """(eval length, level) -> the fixed test batch of `eval_size` sequences."""
    return {
        (length, level): _on(
            make_batch(
                task,
                cfg,
                cfg.eval_size,
                length,
                torch.Generator().manual_seed(seed * STREAM + 2 + 64 * length + i),
                level,
            ),
            device,
        )
        for length in eval_lengths(cfg)
        for i, level in enumerate(levels(task, cfg))
    }


def run_cell(
    cfg: AttentionStudyConfig,
    task: str,
    model_name: str,
    attention: str,
    device: torch.device,
    log: logging.Logger | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The lr sweep, the remaining seeds at the chosen lr, and the tests: (curves, sweep, evaluation)."""
    log = log or logging.getLogger(__name__)
    kind = KINDS[attention]
    cell = {"task": task, "model": model_name, "attention": attention}
    marks = {"family": kind.family, "loudness_invariant": kind.loudness_invariant}
    curves, sweep, models = [], [], {}

    def run(lr: float, seed: int) -> None:
        start = time.perf_counter()
        model, rows, final, diverged, progress = train_run(cfg, task, model_name, attention, lr, seed, device)
        curves.extend(rows)
        sweep.append({"lr": lr, "seed": seed, **final, "diverged": diverged, **progress})
        models[lr, seed] = copy.deepcopy(model.state_dict())
        log.info(
            "%s %s %s lr %g seed %d: val token acc %.4f%s after %d steps%s (%.1f s)",
            task,
            model_name,
            attention,
            lr,
            seed,
            final["val_token_acc"],
            ", diverged" if diverged else "",
            progress["steps_run"],
            ", at the step limit" if progress["at_step_limit"] else "",
            time.perf_counter() - start,
        )

    tried = list(cfg.lrs)
    for lr in tried:
        for seed in cfg.seeds[: cfg.sweep_seeds]:
            run(lr, seed)
    for _ in range(cfg.lr_extensions):
        chosen = best_lr(pd.DataFrame(sweep))
        lr = None if chosen is None else extension(chosen, tried, cfg.lr_step)
        if lr is None:
            break
        log.info("%s %s %s: the best lr %g is an end of %s; trying %g", task, model_name, attention, chosen, tried, lr)
        tried.append(lr)
        for seed in cfg.seeds[: cfg.sweep_seeds]:
            run(lr, seed)
    chosen = best_lr(pd.DataFrame(sweep))
    if chosen is None:
        raise TrainingDivergedError(
            f"{task} with the {model_name} model and {attention} attention: every lr has a diverged run; "
            f"lower config key 'attention.lrs' ({list(cfg.lrs)})"
        )
    edge = lr_edge(chosen, tried)
    for seed in cfg.seeds[cfg.sweep_seeds :]:
        run(chosen, seed)
    final = pd.DataFrame(sweep).set_index(["lr", "seed"])
    rows = []
    for seed in cfg.seeds:
        model = build_model(model_name, attention, cfg).to(device)
        model.load_state_dict(models[chosen, seed])
        validation = final.loc[(chosen, seed)]
        for (length, level), batch in test_sets(task, cfg, seed, device).items():
            metrics = (
                dict.fromkeys(("loss", "token_acc", "seq_acc"), math.nan)
                if validation["diverged"]
                else evaluate(model, batch, cfg.batch_size)
            )  # a diverged model's argmax is noise, not an accuracy
            rows.append(
                {
                    **cell,
                    "lr": chosen,
                    "lr_at_edge": edge,
                    "seed": seed,
                    "train_len": cfg.train_len,
                    "eval_len": length,
                    "level": level,
                    **metrics,
                    "val_token_acc": validation["val_token_acc"],
                    "diverged": bool(validation["diverged"]),
                    **marks,
                    **{key: validation[key] for key in PROGRESS},
                }
            )
    return (
        pd.DataFrame(curves).assign(**cell),
        pd.DataFrame(sweep).assign(
            **cell, chosen=lambda d: d["lr"] == chosen, extended=lambda d: ~d["lr"].isin(cfg.lrs), lr_at_edge=edge
        ),
        pd.DataFrame(rows),
    )
